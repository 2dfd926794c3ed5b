package comm

import (
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// strangerBytes is what a flood connection sends: a 4-byte length claiming a
// 1 MiB message (what the JSON hello's reader allocated before reading on), then
// padding to 80 bytes, the size of a preamble.
func strangerBytes() []byte {
	b := make([]byte, 80)
	binary.LittleEndian.PutUint32(b, 1<<20)
	return b
}

// flood opens n connections to addr at once, sends each strangerBytes and waits
// until the listener has closed every one (each read ends).
func flood(t *testing.T, addr string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute))
			c.Write(strangerBytes())
			io.Copy(io.Discard, c) // until the listener closes it
		}()
	}
	wg.Wait()
}

// allocatedDuring is the bytes the process allocated while f ran.
func allocatedDuring(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// jobOf joins n ranks over loopback and returns their world communicators,
// closed when the test ends.
func jobOf(t *testing.T, n int, timeout time.Duration) []*TCP {
	t.Helper()
	addr := freeAddr(t)
	cs := make([]*TCP, n)
	errs := concurrently(n, func(r int) error {
		c, err := DialTCP(TCPConfig{Rank: r, World: n, MasterAddr: addr, Token: "job", Timeout: timeout})
		cs[r] = c
		return err
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		t.Cleanup(func() { cs[r].Close() })
	}
	return cs
}

// The attack of issue 46: 1,500 unauthenticated local connections to a rank's
// peer listener, mid-job, took rank 0 from 122 MB to 1.66 GB, because each
// connection's reader allocated the 1 MiB its first 4 bytes claimed before
// checking the job token. Now a connection proves the token in a fixed 80-byte
// preamble first: the flood allocates next to nothing, and the job goes on.
func TestStrangersOnPeerListenersCostNoMemory(t *testing.T) {
	const strangers = 1500
	cs := jobOf(t, 2, 8*time.Second)
	got := allocatedDuring(func() { flood(t, cs[0].node.ln.Addr().String(), strangers) })
	assert.Less(t, got, uint64(64<<20), "%d strangers made the process allocate %d MiB", strangers, got>>20)
	errs := concurrently(2, func(r int) error { return cs[r].AllReduce(make([]float32, 8)) })
	assert.NoError(t, errs[0])
	assert.NoError(t, errs[1])
}

// The same flood at the rendezvous, before rank 1 has joined: it allocates next
// to nothing, and rank 1 still joins.
func TestStrangersAtTheRendezvousCostNoMemory(t *testing.T) {
	const strangers = 1500
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	host := make(chan error, 1)
	go func() {
		c, err := DialTCP(TCPConfig{Rank: 0, World: 2, MasterAddr: addr, Token: "job", Timeout: 8 * time.Second, Listener: ln})
		if err == nil {
			err = c.AllReduce(make([]float32, 8))
			c.Close()
		}
		host <- err
	}()
	got := allocatedDuring(func() { flood(t, addr, strangers) })
	assert.Less(t, got, uint64(64<<20), "%d strangers made the process allocate %d MiB", strangers, got>>20)
	c, err := DialTCP(TCPConfig{Rank: 1, World: 2, MasterAddr: addr, Token: "job", Timeout: 8 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	assert.NoError(t, c.AllReduce(make([]float32, 8)))
	assert.NoError(t, <-host)
}

// Silent connections hold a handshake slot until their deadline (helloTimeout);
// no more than maxHandshakes are held at once, the rest wait in the accept
// queue, every one is closed in the end, and the job goes on.
func TestHandshakesAreCapped(t *testing.T) {
	const silent = maxHandshakes + 40
	cs := jobOf(t, 2, 2*time.Second) // a 0.5 s handshake deadline
	addr := cs[1].node.ln.Addr().String()
	var wg sync.WaitGroup
	for range silent {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute))
			n, _ := io.Copy(io.Discard, c) // until the listener closes it
			assert.Zero(t, n)
		}()
	}
	wg.Wait()
	g := cs[1].node.handshakes
	assert.LessOrEqual(t, g.peak.Load(), int32(maxHandshakes), "the listener held at most maxHandshakes unproven connections")
	assert.NotZero(t, g.peak.Load())
	errs := concurrently(2, func(r int) error { return cs[r].AllReduce(make([]float32, 8)) })
	assert.NoError(t, errs[0])
	assert.NoError(t, errs[1])
}

// scriptedListener returns its errors and connections in order, then
// net.ErrClosed.
type scriptedListener struct {
	net.Listener
	script []any // error or net.Conn
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	if len(l.script) == 0 {
		return nil, &net.OpError{Op: "accept", Err: net.ErrClosed}
	}
	next := l.script[0]
	l.script = l.script[1:]
	if c, ok := next.(net.Conn); ok {
		return c, nil
	}
	return nil, next.(error)
}

// An accept error other than a closed listener (out of file descriptors, as a
// flood of connections can cause) does not end the listener: the connection
// after it is still handled. It ended the accept loop for good.
func TestAcceptOutlivesAnAcceptError(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	ln := &scriptedListener{script: []any{&net.OpError{Op: "accept", Err: syscall.EMFILE}, a}}
	handled := make(chan net.Conn, 2)
	go acceptGated(ln, newGate(), func() time.Time { return time.Now().Add(time.Minute) }, func(c net.Conn) { handled <- c })
	select {
	case c := <-handled:
		assert.Equal(t, a, c)
	case <-time.After(time.Minute):
		t.Fatal("the connection after the accept error was never handled")
	}
}
