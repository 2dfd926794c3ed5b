//go:build cuda

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// NCCL is opened with dlopen ("libnccl.so.2"), never linked, and no nccl.h is
// needed to build: the few types it takes are declared here as NCCL 2.x
// defines them (a 128-byte unique id passed by value, an opaque communicator,
// int enums). Functions NCCL added late (user-buffer allocation and
// registration, 2.19; the last error, 2.13) are looked up optionally, so an
// older library still runs the collectives and only what needs them is refused.
typedef struct { char internal[128]; } nc_uid;
typedef void* nc_comm;
typedef int nc_res;

typedef nc_res (*f_version)(int*);
typedef nc_res (*f_uid)(nc_uid*);
typedef nc_res (*f_init)(nc_comm*, int, nc_uid, int);
typedef nc_res (*f_comm)(nc_comm);
typedef const char* (*f_errstr)(nc_res);
typedef const char* (*f_lasterr)(nc_comm);
typedef nc_res (*f_async)(nc_comm, nc_res*);
typedef nc_res (*f_group)(void);
typedef nc_res (*f_allgather)(const void*, void*, size_t, int, nc_comm, void*);
typedef nc_res (*f_reduce)(const void*, void*, size_t, int, int, nc_comm, void*);
typedef nc_res (*f_bcast)(const void*, void*, size_t, int, int, nc_comm, void*);
typedef nc_res (*f_send)(const void*, size_t, int, int, nc_comm, void*);
typedef nc_res (*f_recv)(void*, size_t, int, int, nc_comm, void*);
typedef nc_res (*f_memalloc)(void**, size_t);
typedef nc_res (*f_memfree)(void*);
typedef nc_res (*f_register)(nc_comm, void*, size_t, void**);
typedef nc_res (*f_deregister)(nc_comm, void*);

static struct {
	f_version version; f_uid uid; f_init init; f_comm destroy, abort;
	f_errstr errstr; f_lasterr lasterr; f_async async;
	f_group gstart, gend;
	f_allgather allgather; f_reduce reducescatter, allreduce; f_bcast bcast;
	f_send send; f_recv recv;
	f_memalloc memalloc; f_memfree memfree; f_register reg; f_deregister dereg;
} nc;

static void* nc_lib;

// nc_open loads name and the functions every NCCL 2.x has; it returns NULL,
// or what failed.
static const char* nc_open(const char* name) {
	nc_lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!nc_lib) return dlerror();
#define NC_NEED(f, s) nc.f = (__typeof__(nc.f))dlsym(nc_lib, s); if (!nc.f) return s;
	NC_NEED(version, "ncclGetVersion") NC_NEED(uid, "ncclGetUniqueId") NC_NEED(init, "ncclCommInitRank")
	NC_NEED(destroy, "ncclCommDestroy") NC_NEED(abort, "ncclCommAbort") NC_NEED(errstr, "ncclGetErrorString")
	NC_NEED(async, "ncclCommGetAsyncError") NC_NEED(gstart, "ncclGroupStart") NC_NEED(gend, "ncclGroupEnd")
	NC_NEED(allgather, "ncclAllGather") NC_NEED(reducescatter, "ncclReduceScatter") NC_NEED(allreduce, "ncclAllReduce")
	NC_NEED(bcast, "ncclBroadcast") NC_NEED(send, "ncclSend") NC_NEED(recv, "ncclRecv")
	nc.lasterr = (f_lasterr)dlsym(nc_lib, "ncclGetLastError");
	nc.memalloc = (f_memalloc)dlsym(nc_lib, "ncclMemAlloc");
	nc.memfree = (f_memfree)dlsym(nc_lib, "ncclMemFree");
	nc.reg = (f_register)dlsym(nc_lib, "ncclCommRegister");
	nc.dereg = (f_deregister)dlsym(nc_lib, "ncclCommDeregister");
	return NULL;
}

static int nc_has_ub(void) { return nc.memalloc && nc.memfree && nc.reg && nc.dereg; }
static nc_res nc_version(int* v) { return nc.version(v); }
static nc_res nc_unique(nc_uid* id) { return nc.uid(id); }
static nc_res nc_init(nc_comm* c, int n, const nc_uid* id, int rank) { return nc.init(c, n, *id, rank); }
static nc_res nc_destroy(nc_comm c) { return nc.destroy(c); }
static nc_res nc_abort(nc_comm c) { return nc.abort(c); }
static const char* nc_errstr(nc_res r) { return nc.errstr(r); }
static const char* nc_lasterr(nc_comm c) { return nc.lasterr ? nc.lasterr(c) : ""; }
static nc_res nc_async(nc_comm c, nc_res* r) { return nc.async(c, r); }
static nc_res nc_gstart(void) { return nc.gstart(); }
static nc_res nc_gend(void) { return nc.gend(); }
static nc_res nc_allgather(unsigned long long s, unsigned long long d, size_t n, int t, nc_comm c, void* st) {
	return nc.allgather((const void*)s, (void*)d, n, t, c, st);
}
static nc_res nc_reducescatter(unsigned long long s, unsigned long long d, size_t n, int t, nc_comm c, void* st) {
	return nc.reducescatter((const void*)s, (void*)d, n, t, 0, c, st);
}
static nc_res nc_allreduce(unsigned long long s, unsigned long long d, size_t n, int t, nc_comm c, void* st) {
	return nc.allreduce((const void*)s, (void*)d, n, t, 0, c, st);
}
static nc_res nc_bcast(unsigned long long s, unsigned long long d, size_t n, int t, int root, nc_comm c, void* st) {
	return nc.bcast((const void*)s, (void*)d, n, t, root, c, st);
}
static nc_res nc_send(unsigned long long s, size_t n, int t, int peer, nc_comm c, void* st) {
	return nc.send((const void*)s, n, t, peer, c, st);
}
static nc_res nc_recv(unsigned long long d, size_t n, int t, int peer, nc_comm c, void* st) {
	return nc.recv((void*)d, n, t, peer, c, st);
}
static nc_res nc_memalloc(unsigned long long* p, size_t n) {
	void* v = NULL;
	nc_res r = nc.memalloc(&v, n);
	*p = (unsigned long long)v;
	return r;
}
static nc_res nc_memfree(unsigned long long p) { return nc.memfree((void*)p); }
static nc_res nc_register(nc_comm c, unsigned long long p, size_t n, void** h) { return nc.reg(c, (void*)p, n, h); }
static nc_res nc_deregister(nc_comm c, void* h) { return nc.dereg(c, h); }
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"gorgonia.org/cu"
)

// ncclSpansProcesses: NCCL joins ranks of any process, on any node.
const ncclSpansProcesses = true

// ncclNames are the NCCL libraries tried, in order.
var ncclNames = []string{"libnccl.so.2", "libnccl.so"}

var nccl struct {
	once    sync.Once
	err     error
	library string
	version int
}

// loadNCCL opens the library once per process.
func loadNCCL() error {
	nccl.once.Do(func() {
		nccl.library, nccl.err = openLibrary("NCCL", ncclNames, func(name *C.char) *C.char { return C.nc_open(name) },
			"install NCCL 2 (libnccl2) or add its directory to LD_LIBRARY_PATH")
		if nccl.err != nil {
			return
		}
		var v C.int
		if r := C.nc_version(&v); r != 0 {
			nccl.err = fmt.Errorf("cuda: ncclGetVersion: %s", ncclErrString(r))
			return
		}
		nccl.version = int(v)
	})
	return nccl.err
}

// NCCLVersion loads NCCL and returns its version (10000·major + 100·minor +
// patch, as ncclGetVersion reports it: 22803 is 2.28.3) and the library's name.
func NCCLVersion() (int, string, error) {
	if err := loadNCCL(); err != nil {
		return 0, "", err
	}
	return nccl.version, nccl.library, nil
}

func ncclErrString(r C.nc_res) string {
	return fmt.Sprintf("%s (ncclResult %d)", C.GoString(C.nc_errstr(r)), int(r))
}

// NewUniqueID makes the id one rank of a group hands to the others.
func NewUniqueID() ([]byte, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	var id C.nc_uid
	if r := C.nc_unique(&id); r != 0 {
		return nil, fmt.Errorf("cuda: ncclGetUniqueId: %s", ncclErrString(r))
	}
	return C.GoBytes(unsafe.Pointer(&id), UniqueIDBytes), nil
}

// commHandle is NCCL's communicator.
type commHandle = C.nc_comm

func (c *Comm) init(id []byte) error {
	var uid C.nc_uid
	C.memcpy(unsafe.Pointer(&uid), unsafe.Pointer(&id[0]), UniqueIDBytes)
	if r := C.nc_init(&c.h, C.int(c.size), &uid, C.int(c.rank)); r != 0 {
		return errors.New(ncclErrString(r))
	}
	return nil
}

func (c *Comm) destroy() error {
	if r := C.nc_destroy(c.h); r != 0 {
		return errors.New(ncclErrString(r))
	}
	return nil
}

// Abort ends the communicator without waiting for its collectives, from any
// goroutine (ncclCommAbort); once only.
func (c *Comm) Abort() {
	if c.aborted.CompareAndSwap(false, true) {
		C.nc_abort(c.h)
	}
}

// AsyncErr is an error NCCL met while running the communicator's collectives
// (a peer gone, a network failure), nil if none.
func (c *Comm) AsyncErr() error {
	if c.aborted.Load() {
		return nil
	}
	var ar C.nc_res
	if r := C.nc_async(c.h, &ar); r != 0 {
		return fmt.Errorf("cuda: ncclCommGetAsyncError: %s", ncclErrString(r))
	}
	if ar != 0 {
		return c.wrap("running a collective", c.fail(ar))
	}
	return nil
}

// fail is NCCL's error r, with the communicator's last error where the
// library reports one.
func (c *Comm) fail(r C.nc_res) error {
	msg := ncclErrString(r)
	if last := C.GoString(C.nc_lasterr(c.h)); last != "" {
		msg += ": " + last
	}
	return errors.New(msg)
}

func (c *Comm) stream() unsafe.Pointer { return c.d.rawStream() }

func (c *Comm) allGather(dst, src Buffer, t int) error {
	if r := C.nc_allgather(C.ulonglong(src.ptr), C.ulonglong(dst.ptr), C.size_t(src.N), C.int(t), c.h, c.stream()); r != 0 {
		return c.fail(r)
	}
	return nil
}

func (c *Comm) reduceScatter(dst, src Buffer, t int) error {
	if r := C.nc_reducescatter(C.ulonglong(src.ptr), C.ulonglong(dst.ptr), C.size_t(dst.N), C.int(t), c.h, c.stream()); r != 0 {
		return c.fail(r)
	}
	return nil
}

func (c *Comm) allReduce(buf Buffer, t int) error {
	if r := C.nc_allreduce(C.ulonglong(buf.ptr), C.ulonglong(buf.ptr), C.size_t(buf.N), C.int(t), c.h, c.stream()); r != 0 {
		return c.fail(r)
	}
	return nil
}

func (c *Comm) broadcast(buf Buffer, t, root int) error {
	if r := C.nc_bcast(C.ulonglong(buf.ptr), C.ulonglong(buf.ptr), C.size_t(buf.N), C.int(t), C.int(root), c.h, c.stream()); r != 0 {
		return c.fail(r)
	}
	return nil
}

// exchange sends part j of src (send[j] values, parts end to end) to every
// other rank j and receives part i of dst (recv[i]) from every other rank i,
// as one ncclGroupStart/ncclGroupEnd group, so that NCCL runs the sends and
// receives together (no pair waits on another). This rank's own part is the
// caller's.
func (c *Comm) exchange(dst, src Buffer, t int, send, recv []int) error {
	if r := C.nc_gstart(); r != 0 {
		return c.fail(r)
	}
	so, ro := offsets(send), offsets(recv)
	var r C.nc_res
	for j := 0; j < c.size && r == 0; j++ {
		if j == c.rank {
			continue
		}
		if send[j] > 0 {
			r = C.nc_send(C.ulonglong(src.Slice(so[j], so[j]+send[j]).ptr), C.size_t(send[j]), C.int(t), C.int(j), c.h, c.stream())
		}
		if recv[j] > 0 && r == 0 {
			r = C.nc_recv(C.ulonglong(dst.Slice(ro[j], ro[j]+recv[j]).ptr), C.size_t(recv[j]), C.int(t), C.int(j), c.h, c.stream())
		}
	}
	if e := C.nc_gend(); r == 0 {
		r = e
	}
	if r != 0 {
		return c.fail(r)
	}
	return nil
}

// UserBuffers says whether the library can allocate and register user buffers
// (use_nccl_ub), and if not, why.
func UserBuffers() error {
	if err := loadNCCL(); err != nil {
		return err
	}
	if C.nc_has_ub() == 0 {
		return fmt.Errorf("cuda: %s is NCCL %s, which lacks ncclMemAlloc and ncclCommRegister (NCCL 2.19 or later has them); turn off use_nccl_ub or install a newer NCCL",
			nccl.library, versionString(nccl.version))
	}
	return nil
}

// ncclAlloc allocates n elements of t with ncclMemAlloc, on the device
// current on this thread (the device's goroutine).
func (d *Device) ncclAlloc(t DType, n int) (Buffer, error) {
	var p C.ulonglong
	if r := C.nc_memalloc(&p, C.size_t(int64(n)*int64(t.Size()))); r != 0 {
		return Buffer{}, fmt.Errorf("cuda: ncclMemAlloc of %d %s values: %s", n, t, ncclErrString(r))
	}
	d.hold(int64(n) * int64(t.Size()))
	return Buffer{ptr: cu.DevicePtr(p), N: n, DType: t}, nil
}

// ncclFree frees what ncclAlloc allocated.
func (d *Device) ncclFree(b Buffer) error {
	if r := C.nc_memfree(C.ulonglong(b.ptr)); r != 0 {
		return fmt.Errorf("cuda: ncclMemFree: %s", ncclErrString(r))
	}
	d.hold(-b.Bytes())
	return nil
}

// register registers b with the communicator (ncclCommRegister).
func (c *Comm) register(b Buffer) error {
	var h unsafe.Pointer
	if r := C.nc_register(c.h, C.ulonglong(b.ptr), C.size_t(b.Bytes()), &h); r != 0 {
		return c.wrap("ncclCommRegister", c.fail(r))
	}
	c.registered[b.ptr] = h
	return nil
}

// deregister undoes register.
func (c *Comm) deregister(p devicePtr) error {
	h, ok := c.registered[p]
	if !ok {
		return nil
	}
	delete(c.registered, p)
	if c.aborted.Load() {
		return nil // ncclCommAbort released the registrations with the communicator
	}
	if r := C.nc_deregister(c.h, h); r != 0 {
		return c.wrap("ncclCommDeregister", c.fail(r))
	}
	return nil
}
