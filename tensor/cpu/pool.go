package cpu

import (
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Kernels share the cores through one pool of long-lived workers, so a parallel
// region costs no goroutine and no allocation: the caller publishes a job, hands it
// to idle workers, and claims chunks of it itself alongside them; a worker that
// arrives after the last chunk is claimed leaves at once. A caller never waits for
// a worker that is busy elsewhere (it only hands jobs to idle ones), so regions may
// nest and any number of goroutines (in-process ranks) may call kernels at once.
//
// Chunks are fixed by the job's size and the number of cores, never by timing, so
// every result is the same whichever goroutine computed which chunk. Each
// participant first takes the chunk of its own index (the caller chunk 0, worker
// i, numbered from 1, chunk i), so consecutive kernels that split rows alike find
// their rows in the cache of the core that wrote them; then it takes whatever
// chunks are left.

// ranger is a kernel's work over rows [lo, hi) of its index space, which are
// chunk c of it (0 when the kernel runs serially): a job that needs scratch space
// keeps it per chunk, so what it allocates never depends on which goroutine ran
// which chunk.
type ranger interface{ rows(c, lo, hi int) }

// fork is one parallel region in flight.
type fork struct {
	j       ranger
	n, per  int           // index space and chunk size
	chunks  int           // ceil(n/per), at most maxChunks
	claimed atomic.Uint64 // bit c: chunk c is taken
	pending atomic.Int32  // the caller and the workers handed this fork, until they leave
}

const maxChunks = 64

func (f *fork) claim(c int) bool {
	for {
		old := f.claimed.Load()
		if old&(1<<c) != 0 {
			return false
		}
		if f.claimed.CompareAndSwap(old, old|1<<c) {
			return true
		}
	}
}

// help runs chunk `own` if nobody has taken it, then any chunks left.
func (f *fork) help(own int) {
	if own < f.chunks && f.claim(own) {
		f.j.rows(own, own*f.per, min((own+1)*f.per, f.n))
	}
	for c := 0; c < f.chunks; c++ {
		if f.claimed.Load()&(1<<c) == 0 && f.claim(c) {
			f.j.rows(c, c*f.per, min((c+1)*f.per, f.n))
		}
	}
}

type worker struct {
	id   int // its own chunk
	idle atomic.Bool
	ch   chan *fork
}

var (
	startOnce sync.Once
	workers   []*worker
	forks     freeList[fork]
)

func start() {
	for i := 1; i < runtime.NumCPU(); i++ {
		w := &worker{id: i, ch: make(chan *fork, 1)}
		workers = append(workers, w)
		go w.loop()
	}
}

// spinFor is how long an idle worker keeps polling for work, yielding its core
// between polls, before it starts to sleep between polls. Waking a parked thread
// costs tens to hundreds of microseconds on a virtual machine, more than many
// kernels of a small model take; a training step calls kernels back to back, so a
// worker that polls a while stays available through a step. Polling yields to any
// other runnable goroutine (in-process ranks), so it only uses time nobody else
// wants. After spinFor the worker sleeps between polls, from 50 µs up to 1 ms: it
// never blocks on a channel or lock, because parking a goroutine that way
// allocates, and a step must allocate nothing.
const spinFor = 200 * time.Microsecond

func (w *worker) loop() {
	for {
		w.idle.Store(true)
		f := w.wait()
		f.help(w.id)
		f.pending.Add(-1)
	}
}

func (w *worker) wait() *fork {
	deadline := time.Now().Add(spinFor)
	for i := 0; ; i++ {
		select {
		case f := <-w.ch:
			return f
		default:
		}
		if i%64 == 63 && time.Now().After(deadline) {
			break
		}
		runtime.Gosched()
	}
	for nap := 50 * time.Microsecond; ; nap = min(2*nap, time.Millisecond) {
		time.Sleep(nap)
		select {
		case f := <-w.ch:
			return f
		default:
		}
	}
}

// sharers counts the callers that run kernels at the same time in this process
// (ShareCores): the ranks of an in-process run. 0 or 1: one caller.
var sharers atomic.Int32

// threads is how many cores one caller's kernels use: its even share of
// GOMAXPROCS among the sharers, at least 1. N in-process ranks each with every
// core fork every kernel over cores the other ranks are using, and the workers
// they wake poll for work that is not theirs (tiny at 2 ranks on 2 cores:
// 1.16–1.24× the tokens/s with one core each).
func threads() int {
	return max(1, runtime.GOMAXPROCS(0)/max(1, int(sharers.Load())))
}

// ShareCores counts n more callers running kernels at once (tensor.CoreSharer)
// until restore is called; the kernels' results are the same on any number of
// threads (run keeps chunk order; Sgemm splits no sum).
func (Kernels[F]) ShareCores(n int) (restore func()) {
	sharers.Add(int32(n))
	var once sync.Once
	return func() { once.Do(func() { sharers.Add(-int32(n)) }) }
}

// run splits [0, n) into chunks of per (more if that makes over maxChunks) and runs
// j.rows on each, sharing them among the caller and up to threads()−1 idle
// workers; it returns, when all are done, how many chunks there were. Alone, the
// caller still runs the chunks one by one, so a job whose result depends on its
// chunks (partial sums added in chunk order) gets the same result on any number
// of cores.
func run(j ranger, n, per int) (chunks int) {
	per = max(per, (n+maxChunks-1)/maxChunks)
	chunks = (n + per - 1) / per
	helpers := min(chunks, threads()) - 1
	if helpers <= 0 {
		for c := 0; c < chunks; c++ {
			j.rows(c, c*per, min((c+1)*per, n))
		}
		return chunks
	}
	startOnce.Do(start)
	f := forks.get()
	f.j, f.n, f.per, f.chunks = j, n, per, chunks
	f.claimed.Store(0)
	f.pending.Store(1)
	for _, w := range workers {
		if helpers == 0 {
			break
		}
		if w.idle.CompareAndSwap(true, false) {
			f.pending.Add(1)
			w.ch <- f // never blocks: only the winner of the swap sends, and the worker waits
			helpers--
		}
	}
	f.help(0)
	f.pending.Add(-1)
	for f.pending.Load() != 0 { // workers finishing their last chunk, or arriving late
		runtime.Gosched()
	}
	f.j = nil
	forks.put(f)
	return chunks
}

// parallel runs j.rows over [0, n) in one chunk per thread of the caller's share
// (threads) when n·cost (a rough count of operations) is large enough to pay for
// sharing it.
func parallel(j ranger, n, cost int) {
	w := threads()
	if w == 1 || n < 2 || n*cost < 1<<15 {
		j.rows(0, 0, n)
		return
	}
	w = min(w, n)
	run(j, n, (n+w-1)/w)
}

// freeList recycles objects without ever blocking (a contended lock would park
// a goroutine, and parking allocates): a fixed set of slots taken and filled by
// atomic swaps. Unlike sync.Pool it keeps its objects through garbage
// collections. When every slot is full a returned object is left to the
// collector; when every slot is empty get makes a new one.
type freeList[T any] struct {
	slots [64]atomic.Pointer[T]
}

func (l *freeList[T]) get() *T {
	for i := range l.slots {
		if l.slots[i].Load() != nil {
			if it := l.slots[i].Swap(nil); it != nil {
				return it
			}
		}
	}
	return new(T)
}

func (l *freeList[T]) put(it *T) {
	for i := range l.slots {
		if l.slots[i].Load() == nil && l.slots[i].CompareAndSwap(nil, it) {
			return
		}
	}
}

// lists holds one free list per recycled type.
var lists sync.Map // reflect.Type → *freeList[T]

func listOf[T any]() *freeList[T] {
	t := reflect.TypeFor[T]()
	l, ok := lists.Load(t)
	if !ok {
		l, _ = lists.LoadOrStore(t, new(freeList[T]))
	}
	return l.(*freeList[T])
}

// Jobs are recycled per type: a kernel takes one, fills it, runs it and puts it
// back, so the steady state allocates nothing.
func getJob[J any]() *J { return listOf[J]().get() }

// putJob clears j (so it holds no tensor alive) and returns it to its list.
func putJob[J any](j *J) {
	var zero J
	*j = zero
	listOf[J]().put(j)
}

// chunkBufs are a job's buffers, one set per chunk, kept with the job when it is
// recycled: GEMM packing for products inside the job, and n values of scratch.
type chunkBufs[F Float] struct {
	gemm    [maxChunks]gemmBufs
	scratch [maxChunks][]F
}

// scratchFor returns chunk c's scratch of n values (contents undefined).
func (b *chunkBufs[F]) scratchFor(c, n int) []F {
	if cap(b.scratch[c]) < n {
		b.scratch[c] = make([]F, n)
	}
	return b.scratch[c][:n]
}
