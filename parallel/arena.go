package parallel

// Arena places buffers inside one allocation: each request takes the lowest free
// place that fits (first fit), and a freed range merges with free neighbours.
// With a slot size, a request of at most a slot never straddles a multiple of it
// (the arena is a row of slots, each holding whole buffers), which keeps a small
// buffer from leaving a hole below a large one. The FSDP runtime carves its unit
// buffers from an arena of the size the plan computed by running the same
// requests through an unbounded arena (High), so the two agree to the element.
// Steady use allocates nothing once the range list has grown to the most ranges
// it needs.
type Arena struct {
	free []span // free ranges by offset, disjoint and not touching
	size int64  // -1: unbounded
	slot int64  // 0: no slots
	high int64  // the highest end of any range handed out
}

type span struct{ off, n int64 }

// NewArena returns an arena of size elements, or an unbounded one when size < 0
// (for measuring High), in slots of slot elements (0: none).
func NewArena(size, slot int64) *Arena {
	a := &Arena{size: size, slot: slot}
	if size != 0 {
		n := size
		if size < 0 {
			n = 1<<62 - 1
		}
		a.free = append(make([]span, 0, 8), span{0, n})
	}
	return a
}

// Alloc takes n elements (n > 0) and returns their offset; ok is false when no
// free range holds them.
func (a *Arena) Alloc(n int64) (off int64, ok bool) {
	for i, s := range a.free {
		off = s.off
		if a.slot > 0 && n <= a.slot && off/a.slot != (off+n-1)/a.slot {
			off = (off/a.slot + 1) * a.slot // the next slot's start
		}
		if off+n > s.off+s.n {
			continue
		}
		before, after := span{s.off, off - s.off}, span{off + n, s.off + s.n - off - n}
		switch {
		case before.n > 0 && after.n > 0:
			a.free = append(a.free, span{})
			copy(a.free[i+2:], a.free[i+1:])
			a.free[i], a.free[i+1] = before, after
		case before.n > 0:
			a.free[i] = before
		case after.n > 0:
			a.free[i] = after
		default:
			a.free = append(a.free[:i], a.free[i+1:]...)
		}
		a.high = max(a.high, off+n)
		return off, true
	}
	return 0, false
}

// Free returns the n elements at off, which Alloc handed out.
func (a *Arena) Free(off, n int64) {
	i := 0
	for i < len(a.free) && a.free[i].off < off {
		i++
	}
	merged := span{off, n}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == off { // joins the range before
		i--
		merged = span{a.free[i].off, a.free[i].n + n}
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	if i < len(a.free) && merged.off+merged.n == a.free[i].off { // and the one after
		merged.n += a.free[i].n
		a.free[i] = merged
		return
	}
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = merged
}

// High is the highest end of any range handed out: the size an arena needs to
// serve the same requests.
func (a *Arena) High() int64 { return a.high }
