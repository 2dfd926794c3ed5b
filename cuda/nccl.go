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
	"fmt"
	"sync"
	"unsafe"

	"gorgonia.org/cu"
)

// ncclNames are the NCCL libraries tried, in order.
var ncclNames = []string{"libnccl.so.2", "libnccl.so"}

// NCCL's data types (ncclDataType_t).
const (
	ncclInt32    = 2
	ncclFloat32  = 7
	ncclFloat64  = 8
	ncclBFloat16 = 9
)

// UniqueIDBytes is the size of the id an NCCL communicator is made from: one
// rank makes it (NewUniqueID), every rank of the group receives it over the
// job's rendezvous (comm.BroadcastBytes), then each calls NewComm with it.
const UniqueIDBytes = 128

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

// Comm is an NCCL communicator of one group on one device, its collectives
// issued on the device's stream, in order with the kernels. Like every device
// method, its methods run inside Device.Do. A collective returns an error when
// NCCL refuses to enqueue it; what fails later on the device shows in
// Device.Err, and in AsyncErr.
type Comm struct {
	d          *Device
	c          C.nc_comm
	rank, size int
	registered map[cu.DevicePtr]unsafe.Pointer // user buffers: address → NCCL's registration handle
}

// NewComm joins rank of a group of size ranks made from id (NewUniqueID's,
// the same on every rank). It blocks until every rank has joined, as
// ncclCommInitRank does: the job's rendezvous, which carried the id, has
// already seen every rank arrive or named the missing ones.
func (d *Device) NewComm(id []byte, size, rank int) (*Comm, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	if len(id) != UniqueIDBytes {
		return nil, fmt.Errorf("cuda: an NCCL unique id is %d bytes, got %d", UniqueIDBytes, len(id))
	}
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("cuda: NCCL rank %d of a group of %d", rank, size)
	}
	var uid C.nc_uid
	C.memcpy(unsafe.Pointer(&uid), unsafe.Pointer(&id[0]), UniqueIDBytes)
	c := &Comm{d: d, rank: rank, size: size, registered: map[cu.DevicePtr]unsafe.Pointer{}}
	if r := C.nc_init(&c.c, C.int(size), &uid, C.int(rank)); r != 0 {
		return nil, fmt.Errorf("cuda: ncclCommInitRank (rank %d of %d on device %d): %s", rank, size, d.Ordinal, ncclErrString(r))
	}
	return c, nil
}

// Rank is this member's index in the group; Size the group's ranks.
func (c *Comm) Rank() int { return c.rank }
func (c *Comm) Size() int { return c.size }

// Close releases the user buffers still registered and the communicator, after
// the work issued on the stream; Abort gives it up at once (a rank was lost).
func (c *Comm) Close() error {
	for p := range c.registered {
		c.FreeUserBuffer(Buffer{ptr: p})
	}
	if err := c.d.syncStream(); err != nil {
		return fmt.Errorf("cuda: closing an NCCL communicator: %w", err)
	}
	if r := C.nc_destroy(c.c); r != 0 {
		return fmt.Errorf("cuda: ncclCommDestroy: %s", ncclErrString(r))
	}
	return nil
}

// Abort ends the communicator without waiting for its collectives.
func (c *Comm) Abort() { C.nc_abort(c.c) }

// AsyncErr is an error NCCL met while running the communicator's collectives
// (a peer gone, a network failure), nil if none.
func (c *Comm) AsyncErr() error {
	var ar C.nc_res
	if r := C.nc_async(c.c, &ar); r != 0 {
		return fmt.Errorf("cuda: ncclCommGetAsyncError: %s", ncclErrString(r))
	}
	if ar != 0 {
		return c.fail("running a collective", ar)
	}
	return nil
}

func (c *Comm) fail(op string, r C.nc_res) error {
	msg := fmt.Sprintf("cuda: NCCL %s (rank %d of %d): %s", op, c.rank, c.size, ncclErrString(r))
	if last := C.GoString(C.nc_lasterr(c.c)); last != "" {
		msg += ": " + last
	}
	return fmt.Errorf("%s", msg)
}

// ncclType is NCCL's name for a buffer dtype.
func ncclType(t DType) (C.int, error) {
	switch t {
	case F32:
		return ncclFloat32, nil
	case BF16:
		return ncclBFloat16, nil
	case I32:
		return ncclInt32, nil
	case F64:
		return ncclFloat64, nil
	}
	return 0, fmt.Errorf("no NCCL type for %s", t)
}

// operands checks a collective's buffers: one dtype, the lengths it needs, and
// no earlier failure on the device's stream (which would leave the peers
// waiting on data this rank never makes: the caller aborts the job instead).
func (c *Comm) operands(op string, dst, src Buffer, dstLen, srcLen int) (C.int, error) {
	if c.d.err != nil {
		return 0, fmt.Errorf("cuda: NCCL %s after a failure on the stream: %w", op, c.d.err)
	}
	if dst.DType != src.DType || dst.N != dstLen || src.N != srcLen {
		return 0, fmt.Errorf("cuda: NCCL %s (rank %d of %d): %d %s into %d %s, want %d into %d", op, c.rank, c.size,
			src.N, src.DType, dst.N, dst.DType, srcLen, dstLen)
	}
	t, err := ncclType(dst.DType)
	if err != nil {
		return 0, fmt.Errorf("cuda: NCCL %s: %w", op, err)
	}
	return t, nil
}

func (c *Comm) stream() unsafe.Pointer { return c.d.rawStream() }

// AllGather sets dst (Size·len(src)) to every rank's src in rank order.
func (c *Comm) AllGather(dst, src Buffer) error {
	t, err := c.operands("all-gather", dst, src, c.size*src.N, src.N)
	if err != nil || src.N == 0 {
		return err
	}
	if r := C.nc_allgather(C.ulonglong(src.ptr), C.ulonglong(dst.ptr), C.size_t(src.N), t, c.c, c.stream()); r != 0 {
		return c.fail("all-gather", r)
	}
	return nil
}

// ReduceScatter sums src (Size·len(dst)) over the ranks and leaves chunk Rank
// in dst. NCCL sums bf16 in its ring's order, rounding to bf16 at every hop
// (the host communicators sum in fp32 and round once): bf16 results may differ
// from theirs by a few units in the last place.
func (c *Comm) ReduceScatter(dst, src Buffer) error {
	t, err := c.operands("reduce-scatter", dst, src, dst.N, c.size*dst.N)
	if err != nil || dst.N == 0 {
		return err
	}
	if r := C.nc_reducescatter(C.ulonglong(src.ptr), C.ulonglong(dst.ptr), C.size_t(dst.N), t, c.c, c.stream()); r != 0 {
		return c.fail("reduce-scatter", r)
	}
	return nil
}

// AllReduce sums buf over the ranks, in place.
func (c *Comm) AllReduce(buf Buffer) error {
	t, err := c.operands("all-reduce", buf, buf, buf.N, buf.N)
	if err != nil || buf.N == 0 {
		return err
	}
	if r := C.nc_allreduce(C.ulonglong(buf.ptr), C.ulonglong(buf.ptr), C.size_t(buf.N), t, c.c, c.stream()); r != 0 {
		return c.fail("all-reduce", r)
	}
	return nil
}

// Broadcast copies root's buf to every rank's, in place.
func (c *Comm) Broadcast(buf Buffer, root int) error {
	t, err := c.operands("broadcast", buf, buf, buf.N, buf.N)
	if err != nil || buf.N == 0 {
		return err
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("cuda: NCCL broadcast from rank %d in a group of %d", root, c.size)
	}
	if r := C.nc_bcast(C.ulonglong(buf.ptr), C.ulonglong(buf.ptr), C.size_t(buf.N), t, C.int(root), c.c, c.stream()); r != 0 {
		return c.fail("broadcast", r)
	}
	return nil
}

// AllToAll sends src[Σ send[:j] : Σ send[:j+1]] to rank j and receives from
// rank i into dst[Σ recv[:i] : Σ recv[:i+1]] (recv[i] must equal rank i's
// send[Rank]): uneven splits, as one NCCL group of sends and receives. This
// rank's own part is a device copy.
func (c *Comm) AllToAll(dst, src Buffer, send, recv []int) error {
	if len(send) != c.size || len(recv) != c.size {
		return fmt.Errorf("cuda: NCCL all-to-all (rank %d of %d): %d send and %d receive counts, want %d each", c.rank, c.size, len(send), len(recv), c.size)
	}
	ns, nr := 0, 0
	for j := range send {
		if send[j] < 0 || recv[j] < 0 {
			return fmt.Errorf("cuda: NCCL all-to-all: negative count (send %v, recv %v)", send, recv)
		}
		ns, nr = ns+send[j], nr+recv[j]
	}
	if send[c.rank] != recv[c.rank] {
		return fmt.Errorf("cuda: NCCL all-to-all (rank %d): sends itself %d values but receives %d", c.rank, send[c.rank], recv[c.rank])
	}
	t, err := c.operands("all-to-all", dst, src, nr, ns)
	if err != nil {
		return err
	}
	return c.group("all-to-all", func() C.nc_res {
		so, ro := 0, 0
		for j := 0; j < c.size; j++ {
			if j == c.rank {
				c.d.Copy(dst.Slice(ro, ro+recv[j]), src.Slice(so, so+send[j]))
			} else {
				if send[j] > 0 {
					if r := C.nc_send(C.ulonglong(src.Slice(so, so+send[j]).ptr), C.size_t(send[j]), t, C.int(j), c.c, c.stream()); r != 0 {
						return r
					}
				}
				if recv[j] > 0 {
					if r := C.nc_recv(C.ulonglong(dst.Slice(ro, ro+recv[j]).ptr), C.size_t(recv[j]), t, C.int(j), c.c, c.stream()); r != 0 {
						return r
					}
				}
			}
			so, ro = so+send[j], ro+recv[j]
		}
		return 0
	})
}

// SendRecv is one ring step: this member sends src to member to and receives
// dst (the same length) from member from. A member that is its own peer copies.
func (c *Comm) SendRecv(dst, src Buffer, to, from int) error {
	t, err := c.operands("send/recv", dst, src, src.N, dst.N)
	if err != nil || src.N == 0 {
		return err
	}
	if to < 0 || to >= c.size || from < 0 || from >= c.size || (to == c.rank) != (from == c.rank) {
		return fmt.Errorf("cuda: NCCL send/recv (rank %d of %d): to %d, from %d", c.rank, c.size, to, from)
	}
	if to == c.rank {
		c.d.Copy(dst, src)
		return nil
	}
	return c.group("send/recv", func() C.nc_res {
		if r := C.nc_send(C.ulonglong(src.ptr), C.size_t(src.N), t, C.int(to), c.c, c.stream()); r != 0 {
			return r
		}
		return C.nc_recv(C.ulonglong(dst.ptr), C.size_t(dst.N), t, C.int(from), c.c, c.stream())
	})
}

// group issues ops between ncclGroupStart and ncclGroupEnd, so that NCCL runs
// the sends and receives together (no pair waits on another).
func (c *Comm) group(op string, ops func() C.nc_res) error {
	if r := C.nc_gstart(); r != 0 {
		return c.fail(op, r)
	}
	r := ops()
	if e := C.nc_gend(); r == 0 {
		r = e
	}
	if r != 0 {
		return c.fail(op, r)
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

func versionString(v int) string { return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100) }

// AllocUserBuffer allocates n elements of t with ncclMemAlloc and registers
// them with the communicator, so that collectives on them (the FSDP gather
// buffers under use_nccl_ub) skip NCCL's internal staging copies. Free it with
// FreeUserBuffer (or Close).
func (c *Comm) AllocUserBuffer(t DType, n int) (Buffer, error) {
	if err := UserBuffers(); err != nil {
		return Buffer{}, err
	}
	bytes := C.size_t(int64(n) * int64(t.Size()))
	var p C.ulonglong
	if r := C.nc_memalloc(&p, bytes); r != 0 {
		return Buffer{}, c.fail(fmt.Sprintf("ncclMemAlloc of %d %s values", n, t), r)
	}
	var h unsafe.Pointer
	if r := C.nc_register(c.c, p, bytes, &h); r != 0 {
		C.nc_memfree(p)
		return Buffer{}, c.fail("ncclCommRegister", r)
	}
	b := Buffer{ptr: cu.DevicePtr(p), N: n, DType: t}
	c.registered[b.ptr] = h
	return b, nil
}

// FreeUserBuffer deregisters and frees a buffer AllocUserBuffer made, after
// the work issued on the stream.
func (c *Comm) FreeUserBuffer(b Buffer) {
	h, ok := c.registered[b.ptr]
	if !ok {
		return
	}
	delete(c.registered, b.ptr)
	c.d.fail("freeing an NCCL user buffer", c.d.syncStream())
	if r := C.nc_deregister(c.c, h); r != 0 {
		c.d.fail("ncclCommDeregister", c.fail("deregistering a user buffer", r))
	}
	if r := C.nc_memfree(C.ulonglong(b.ptr)); r != 0 {
		c.d.fail("ncclMemFree", c.fail("freeing a user buffer", r))
	}
}
