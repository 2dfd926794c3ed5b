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
// participant first takes the chunk of its own index (the caller chunk 0, worker i
// chunk i+1), so consecutive kernels that split rows alike find their rows in the
// cache of the core that wrote them; then it takes whatever chunks are left.

// ranger is a kernel's work over rows [lo, hi) of its index space.
type ranger interface{ rows(lo, hi int) }

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
		f.j.rows(own*f.per, min((own+1)*f.per, f.n))
	}
	for c := 0; c < f.chunks; c++ {
		if f.claimed.Load()&(1<<c) == 0 && f.claim(c) {
			f.j.rows(c*f.per, min((c+1)*f.per, f.n))
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
	forks     = sync.Pool{New: func() any { return new(fork) }}
)

func start() {
	for i := 1; i < runtime.NumCPU(); i++ {
		w := &worker{id: i, ch: make(chan *fork, 1)}
		workers = append(workers, w)
		go w.loop()
	}
}

// spinFor is how long an idle worker keeps polling for work before it parks. Waking
// a parked thread costs tens to hundreds of microseconds on a virtual machine,
// more than many kernels of a small model take; a training step calls kernels
// back to back, so a worker that polls a little while stays available through a
// step and parks between steps. Polling yields its core to any other runnable
// goroutine (in-process ranks), so it only uses time nobody else wants.
const spinFor = 200 * time.Microsecond

func (w *worker) loop() {
	for {
		w.idle.Store(true)
		var f *fork
		deadline := time.Now().Add(spinFor)
	poll:
		for i := 0; ; i++ {
			select {
			case f = <-w.ch:
				break poll
			default:
			}
			if i%64 == 63 && time.Now().After(deadline) {
				f = <-w.ch
				break
			}
			runtime.Gosched()
		}
		f.help(w.id)
		f.pending.Add(-1)
	}
}

// run splits [0, n) into chunks of per and runs j.rows on each, sharing them among
// the caller and up to GOMAXPROCS−1 idle workers; it returns when all are done.
func run(j ranger, n, per int) {
	per = max(per, (n+maxChunks-1)/maxChunks)
	chunks := (n + per - 1) / per
	helpers := min(chunks, runtime.GOMAXPROCS(0)) - 1
	if helpers <= 0 {
		j.rows(0, n)
		return
	}
	startOnce.Do(start)
	f := forks.Get().(*fork)
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
	forks.Put(f)
}

// parallel runs j.rows over [0, n) in one chunk per core when n·cost (a rough count
// of operations) is large enough to pay for sharing it.
func parallel(j ranger, n, cost int) {
	w := runtime.GOMAXPROCS(0)
	if w == 1 || n < 2 || n*cost < 1<<15 {
		j.rows(0, n)
		return
	}
	w = min(w, n)
	run(j, n, (n+w-1)/w)
}

// Jobs are recycled per type: a kernel takes one, fills it, runs it and puts it
// back, so the steady state allocates nothing.
var jobPools sync.Map // reflect.Type → *sync.Pool

func getJob[J any]() *J {
	t := reflect.TypeFor[J]()
	p, ok := jobPools.Load(t)
	if !ok {
		p, _ = jobPools.LoadOrStore(t, &sync.Pool{New: func() any { return new(J) }})
	}
	return p.(*sync.Pool).Get().(*J)
}

// putJob clears j (so it holds no tensor alive) and returns it to its pool.
func putJob[J any](j *J) {
	var zero J
	*j = zero
	p, _ := jobPools.Load(reflect.TypeFor[J]())
	p.(*sync.Pool).Put(j)
}

// scratch buffers, recycled per element type.
var scratchPools [2]sync.Pool

func getScratch[F Float](n int) *[]F {
	pool := &scratchPools[0]
	if _, ok := any(F(0)).(float64); ok {
		pool = &scratchPools[1]
	}
	if s, ok := pool.Get().(*[]F); ok {
		if cap(*s) >= n {
			*s = (*s)[:n]
			return s
		}
	}
	s := make([]F, n)
	return &s
}

func putScratch[F Float](s *[]F) {
	pool := &scratchPools[0]
	if _, ok := any(F(0)).(float64); ok {
		pool = &scratchPools[1]
	}
	pool.Put(s)
}
