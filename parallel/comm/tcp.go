package comm

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// TCPConfig says how a rank joins a job over TCP.
type TCPConfig struct {
	Rank, World int
	// MasterAddr is host:port where rank 0 hosts the rendezvous.
	MasterAddr string
	// Token is the job's secret: a peer presenting another one is refused.
	Token string
	// Timeout bounds joining the job and each collective as a whole.
	Timeout time.Duration
	// ListenHost is the address this rank accepts peers on (default 127.0.0.1).
	ListenHost string
	// Listener, for rank 0, is the rendezvous socket already bound at MasterAddr
	// (shardline launch binds it and passes it down, so no other process can take
	// the port between choosing it and hosting on it); nil binds MasterAddr here.
	// The rendezvous closes it.
	Listener net.Listener
}

// ErrRefused marks a peer turned away at the rendezvous (wrong token or world).
var ErrRefused = errors.New("refused by the rendezvous")

// TCP is one communicator of a job over TCP: a full mesh of connections among its
// members, one per peer. The world communicator (DialTCP) and every group made
// from it (Group) have connections of their own, so collectives on different
// communicators never interleave on a socket and may run concurrently, as separate
// NCCL communicators do.
type TCP struct {
	rank, n int   // this member's index in the group, the group's size
	ranks   []int // the members' world ranks
	node    *node
	world   bool // the world communicator: its Close closes the node
	timeout time.Duration
	// deadline bounds the collective in progress: set once when it starts, it
	// applies to every frame sent and received for it, so a peer that trickles
	// frames cannot stretch a collective past the timeout.
	deadline time.Time
	peers    []*peerConn
	seq      uint64
	rsBuf    [2][]float32 // reduce-scatter partial sums, kept between calls
	arBuf    []float32    // all-reduce's padded copy and its chunk
	bfBuf    []uint16     // bf16 reduce-scatter's received chunks
	sent     atomic.Int64 // bytes written to peers, frame headers included
	barrier  [1]float32
}

type peerConn struct {
	rank int // world rank, for errors
	c    net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	// Frame headers being written and read: one send and one receive at a time
	// per peer, so they need no allocation per frame.
	whdr, rhdr [20]byte
	// The peer's sender: a goroutine (started at its first send, ended by
	// closePeers) that writes each job's payload and reports on done, so a
	// collective sends to several peers at once without starting a goroutine.
	// mu orders starting it and sending to it against closing it.
	mu     sync.Mutex
	jobs   chan sendJob
	done   chan error
	closed bool
}

// sendJob is one payload for a peer's sender.
type sendJob struct {
	t   *TCP
	seq uint64
	b   []byte
}

// sendAsync starts sending b to p on p's sender; p.wait returns the result (a
// closed connection's error once closePeers ran). A collective waits for every
// send it started before it returns, so at most one is in flight per peer and
// handing it over never blocks.
func (t *TCP) sendAsync(p *peerConn, seq uint64, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.jobs == nil {
		p.jobs, p.done = make(chan sendJob, 1), make(chan error, 1)
		if !p.closed {
			go func() {
				for j := range p.jobs {
					p.done <- j.t.sendFrames(p, j.seq, j.b)
				}
			}()
		}
	}
	if p.closed {
		p.done <- t.lost(p, net.ErrClosed)
		return
	}
	p.jobs <- sendJob{t, seq, b}
}

func (p *peerConn) wait() error { return <-p.done }

// node is what one process's communicators share: its listener, every rank's
// address, the job token, and the connections peers have opened to it, filed by
// group until that group claims them.
type node struct {
	rank    int               // world rank
	token   [sha256.Size]byte // the job token's digest (tokenDigest)
	addrs   []string
	timeout time.Duration
	ln      net.Listener
	making  sync.Mutex // held while Group builds a communicator

	mu      sync.Mutex
	arrived chan struct{}                          // closed and replaced when a connection is filed
	pending map[[sha256.Size]byte]map[int]net.Conn // group key's digest → world rank → connection
	groups  map[string]*TCP                        // groups made so far, by key
	closed  bool
	failure error         // the first failed collective's error; see TCP.begin
	failed  chan struct{} // closed when failure is set (Aborted)
	// handshakes bounds the connections accept authenticates at once.
	handshakes *gate
}

// DialTCP joins the job: rank 0 hosts the rendezvous at MasterAddr and every rank
// learns the others' addresses from it; then each pair of ranks connects. It
// returns the world communicator; its Group makes communicators over subsets, and
// its Close tears every connection down.
func DialTCP(cfg TCPConfig) (*TCP, error) {
	if cfg.World < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.World {
		return nil, fmt.Errorf("comm: rank %d outside a world of %d", cfg.Rank, cfg.World)
	}
	host := cfg.ListenHost
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("comm: rank %d cannot listen: %w", cfg.Rank, err)
	}
	deadline := time.Now().Add(cfg.Timeout)
	var addrs []string
	if cfg.Rank == 0 {
		addrs, err = hostRendezvous(cfg, ln.Addr().String(), deadline)
	} else {
		addrs, err = joinRendezvous(cfg, ln.Addr().String(), deadline)
	}
	if err != nil {
		ln.Close()
		return nil, err
	}
	nd := &node{rank: cfg.Rank, token: tokenDigest(cfg.Token), addrs: addrs, timeout: cfg.Timeout, ln: ln, failed: make(chan struct{}),
		arrived: make(chan struct{}), pending: map[[sha256.Size]byte]map[int]net.Conn{}, groups: map[string]*TCP{}, handshakes: newGate()}
	go nd.accept()
	all := make([]int, cfg.World)
	for i := range all {
		all[i] = i
	}
	t, err := nd.connect(worldKey, all)
	if err != nil {
		nd.close()
		return nil, err
	}
	t.world = true
	return t, nil
}

const worldKey = "world"

// Group returns the communicator over the world ranks `ranks` (ascending, holding
// this rank). Every member asks for the same list and tag and gets connected to the
// others; asking again returns the same communicator. Different tags over the same
// ranks are independent communicators. The whole world with no tag is the world
// communicator itself. Members may build their groups in any order.
func (t *TCP) Group(ranks []int, tag string) (Communicator, error) {
	nd := t.node
	ascending := len(ranks) > 0 && ranks[0] >= 0 && ranks[len(ranks)-1] < len(nd.addrs)
	for i := 1; i < len(ranks); i++ {
		ascending = ascending && ranks[i-1] < ranks[i]
	}
	if !ascending || slices.Index(ranks, nd.rank) < 0 {
		return nil, fmt.Errorf("comm: rank %d cannot join group %v of a world of %d", nd.rank, ranks, len(nd.addrs))
	}
	key := tag + fmt.Sprint(ranks)
	if tag == "" && len(ranks) == len(nd.addrs) {
		key = worldKey
	}
	nd.making.Lock() // one group at a time, so that two callers never build the same one
	defer nd.making.Unlock()
	nd.mu.Lock()
	g, ok := nd.groups[key]
	nd.mu.Unlock()
	if ok {
		return g, nil
	}
	return nd.connect(key, ranks)
}

// accept files every connection a peer opens, once its preamble has proved the
// job token, under the group it names; it ends when the listener closes. At most
// maxHandshakes connections are read at once, each for at most helloTimeout and
// preambleSize bytes: a stranger costs no more.
func (nd *node) accept() {
	acceptGated(nd.ln, nd.handshakes, func() time.Time { return time.Now().Add(helloTimeout(nd.timeout)) }, func(c net.Conn) {
		var b [preambleSize]byte
		p, err := readPreamble(c, nd.token, &b)
		if err != nil || p.kind != kindPeer || int64(p.world) != int64(len(nd.addrs)) || int64(p.rank) >= int64(len(nd.addrs)) || p.group == ([sha256.Size]byte{}) {
			c.Close() // not a peer of this job
			return
		}
		nd.mu.Lock()
		defer nd.mu.Unlock()
		r := int(p.rank)
		if nd.closed || nd.pending[p.group][r] != nil {
			c.Close()
			return
		}
		if nd.pending[p.group] == nil {
			nd.pending[p.group] = map[int]net.Conn{}
		}
		nd.pending[p.group][r] = c
		close(nd.arrived)
		nd.arrived = make(chan struct{})
	})
}

// connect builds a group's mesh: each member dials the members below it and
// takes the connections the members above it opened.
func (nd *node) connect(key string, ranks []int) (*TCP, error) {
	idx := slices.Index(ranks, nd.rank)
	t := &TCP{rank: idx, n: len(ranks), ranks: ranks, node: nd, timeout: nd.timeout, peers: make([]*peerConn, len(ranks))}
	deadline := time.Now().Add(nd.timeout)
	digest := groupDigest(key)
	fail := func(err error) (*TCP, error) {
		t.closePeers()
		return nil, err
	}
	for j := 0; j < idx; j++ {
		r := ranks[j]
		c, err := net.DialTimeout("tcp", nd.addrs[r], time.Until(deadline))
		if err != nil {
			return fail(&RankError{Op: "connect", Missing: []int{r}, Err: err})
		}
		c.SetDeadline(deadline)
		if _, err := c.Write(preamble{kind: kindPeer, rank: uint32(nd.rank), world: uint32(len(nd.addrs)), group: digest}.encode(nd.token)); err != nil {
			c.Close()
			return fail(&RankError{Op: "connect", Missing: []int{r}, Err: err})
		}
		t.peers[j] = newPeer(r, c)
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		nd.mu.Lock()
		var missing []int
		for j := idx + 1; j < len(ranks); j++ {
			if c := nd.pending[digest][ranks[j]]; c != nil && t.peers[j] == nil {
				t.peers[j] = newPeer(ranks[j], c)
				delete(nd.pending[digest], ranks[j])
			} else if t.peers[j] == nil {
				missing = append(missing, ranks[j])
			}
		}
		wait := nd.arrived
		if len(missing) == 0 {
			delete(nd.pending, digest)
			nd.groups[key] = t
		}
		nd.mu.Unlock()
		if len(missing) == 0 {
			for _, p := range t.peers {
				if p != nil {
					p.c.SetDeadline(time.Time{})
				}
			}
			return t, nil
		}
		select {
		case <-wait:
		case <-timer.C:
			return fail(&RankError{Op: "connect", Missing: missing, Err: fmt.Errorf("%w: group %s not joined after %v", ErrTimeout, key, nd.timeout)})
		}
	}
}

func newPeer(rank int, c net.Conn) *peerConn {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return &peerConn{rank: rank, c: c, r: bufio.NewReaderSize(c, 1<<16), w: bufio.NewWriterSize(c, 1<<16)}
}

func (t *TCP) closePeers() {
	for _, p := range t.peers {
		if p != nil {
			p.c.Close()
			p.mu.Lock()
			if !p.closed && p.jobs != nil {
				close(p.jobs) // the sender ends after the send in flight, if any
			}
			p.closed = true
			p.mu.Unlock()
		}
	}
}

// close tears down every communicator of the node, the connections no group has
// claimed, and the listener.
func (nd *node) close() error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.closed {
		return nil
	}
	nd.closed = true
	for _, g := range nd.groups {
		g.closePeers()
	}
	for _, m := range nd.pending {
		for _, c := range m {
			c.Close()
		}
	}
	return nd.ln.Close()
}

// Close on the world communicator tears down every connection of this process,
// its groups' included; on a group it closes that group's connections.
func (t *TCP) Close() error {
	if t.world {
		return t.node.close()
	}
	t.closePeers()
	return nil
}

func (t *TCP) Rank() int { return t.rank }

// Aborted is closed once a collective of this process has failed (Aborting):
// the job cannot recover (TCP.begin).
func (t *TCP) Aborted() <-chan struct{} { return t.node.failed }
func (t *TCP) Size() int                { return t.n }

// helloTimeout is how long a connection has to say who it is, at the rendezvous
// and when a peer connects: a real rank sends its hello at once, so a connection
// that is silent this long is not one.
func helloTimeout(total time.Duration) time.Duration { return min(5*time.Second, total/4) }

// hostRendezvous (rank 0) accepts the other ranks at MasterAddr, checks their
// token, world and rank, and sends everyone the table of addresses. Each
// connection's preamble and address are read on its own goroutine with its own
// short deadline (at most maxHandshakes at once), so a connection that says
// nothing delays no one; what such connections did is reported if the
// rendezvous times out.
func hostRendezvous(cfg TCPConfig, self string, deadline time.Time) ([]string, error) {
	addrs := make([]string, cfg.World)
	addrs[0] = self
	if cfg.World == 1 {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return addrs, nil
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.MasterAddr); err != nil {
			return nil, fmt.Errorf("comm: rank 0 cannot host the rendezvous at %s: %w", cfg.MasterAddr, err)
		}
	}
	defer ln.Close() // ends the accept loop below
	conns := make([]net.Conn, cfg.World)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	type arrival struct {
		c    net.Conn
		p    preamble
		addr string
		err  error
	}
	arrivals := make(chan arrival)
	done := make(chan struct{})
	defer close(done)
	token := tokenDigest(cfg.Token)
	handshakeDeadline := func() time.Time {
		if hd := time.Now().Add(helloTimeout(cfg.Timeout)); hd.Before(deadline) {
			return hd
		}
		return deadline
	}
	go acceptGated(ln, newGate(), handshakeDeadline, func(c net.Conn) {
		var b [preambleSize]byte
		p, err := readPreamble(c, token, &b)
		var addr string
		if err == nil && p.kind != kindJoin {
			err = fmt.Errorf("%w: a peer connection, not a join", errNotShardline)
		}
		if err == nil {
			addr, err = readAddr(c)
		}
		select {
		case arrivals <- arrival{c, p, addr, err}:
		case <-done:
			c.Close()
		}
	})
	var turnedAway strangers
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for joined := 1; joined < cfg.World; {
		var a arrival
		select {
		case a = <-arrivals:
		case <-timer.C:
			var missing []int
			for r := 1; r < cfg.World; r++ {
				if conns[r] == nil {
					missing = append(missing, r)
				}
			}
			return nil, &RankError{Op: "rendezvous", Missing: missing, Err: fmt.Errorf("%w: not joined after %v%s", ErrTimeout, cfg.Timeout, turnedAway)}
		}
		from := a.c.RemoteAddr().String()
		var why string
		switch p := a.p; {
		case errors.Is(a.err, errWrongToken):
			why = "wrong job token"
		case a.err != nil:
			a.c.Close()
			turnedAway.add(fmt.Sprintf("%s sent no valid hello (%v)", from, a.err))
			continue // not a shardline peer; keep waiting for the real ones
		case int64(p.world) != int64(cfg.World):
			why = fmt.Sprintf("world size %d, the job has %d", p.world, cfg.World)
		case p.rank < 1 || int64(p.rank) >= int64(cfg.World) || conns[p.rank] != nil:
			why = fmt.Sprintf("rank %d is invalid or taken", p.rank)
		}
		if why != "" {
			_ = writeRefusal(a.c, why)
			a.c.Close()
			turnedAway.add(fmt.Sprintf("%s was refused: %s", from, why))
			continue
		}
		a.c.SetDeadline(deadline)
		conns[a.p.rank], addrs[a.p.rank] = a.c, a.addr
		joined++
	}
	for r := 1; r < cfg.World; r++ {
		if err := writeAnswer(conns[r], addrs); err != nil {
			return nil, &RankError{Op: "rendezvous", Missing: []int{r}, Err: err}
		}
	}
	return addrs, nil
}

// strangers counts connections the rendezvous turned away and keeps the first
// few descriptions, so a flood of them costs no memory.
type strangers struct {
	n     int
	first []string
}

func (s *strangers) add(what string) {
	s.n++
	if len(s.first) < 3 {
		s.first = append(s.first, what)
	}
}

func (s strangers) String() string {
	if s.n == 0 {
		return ""
	}
	more := ""
	if s.n > len(s.first) {
		more = fmt.Sprintf("; %d more", s.n-len(s.first))
	}
	return fmt.Sprintf("; %d connection(s) turned away: %s%s", s.n, strings.Join(s.first, "; "), more)
}

// joinRendezvous (ranks > 0) introduces the rank to rank 0, retrying until rank 0
// listens or the deadline passes.
func joinRendezvous(cfg TCPConfig, self string, deadline time.Time) ([]string, error) {
	var c net.Conn
	var err error
	for {
		c, err = net.DialTimeout("tcp", cfg.MasterAddr, time.Until(deadline))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, &RankError{Op: "rendezvous", Missing: []int{0}, Err: fmt.Errorf("%w: rank 0 not reachable at %s: %v", ErrTimeout, cfg.MasterAddr, err)}
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if err := writeJoin(c, tokenDigest(cfg.Token), cfg.Rank, cfg.World, self); err != nil {
		return nil, &RankError{Op: "rendezvous", Missing: []int{0}, Err: err}
	}
	peers, err := readAnswer(c, cfg.World)
	switch {
	case errors.Is(err, ErrRefused):
		return nil, &RankError{Op: "rendezvous", Err: err}
	case err != nil:
		return nil, &RankError{Op: "rendezvous", Missing: []int{0}, Err: err}
	}
	return peers, nil
}

// Frames: magic, op sequence number, payload length, payload. The receiver knows
// the length it expects and refuses any other before reading the payload.
const frameMagic = 0x53484c44 // "SHLD"

// begin starts a collective: its deadline is the timeout from now. Once any
// collective of this process has failed (a peer lost, timed out or out of step),
// every later one, on any group, fails at once with that error: the job cannot
// recover, and each collective waiting out its own timeout would multiply the
// time a dead job takes to end.
func (t *TCP) begin() error {
	t.node.mu.Lock()
	err := t.node.failure
	t.node.mu.Unlock()
	if err != nil {
		return err
	}
	t.deadline = time.Now().Add(t.timeout)
	return nil
}

// end records a collective's error for begin (the first one wins) and returns it.
func (t *TCP) end(err error) error {
	if err != nil {
		t.node.mu.Lock()
		if t.node.failure == nil {
			t.node.failure = err
			close(t.node.failed)
		}
		t.node.mu.Unlock()
	}
	return err
}

func (t *TCP) send(p *peerConn, seq uint64, payload []byte) error {
	p.c.SetWriteDeadline(t.deadline)
	hdr := &p.whdr
	binary.LittleEndian.PutUint32(hdr[0:], frameMagic)
	binary.LittleEndian.PutUint64(hdr[4:], seq)
	binary.LittleEndian.PutUint64(hdr[12:], uint64(len(payload)))
	if _, err := p.w.Write(hdr[:]); err != nil {
		return t.lost(p, err)
	}
	if _, err := p.w.Write(payload); err != nil {
		return t.lost(p, err)
	}
	if err := p.w.Flush(); err != nil {
		return t.lost(p, err)
	}
	t.sent.Add(int64(len(hdr) + len(payload)))
	return nil
}

// WireBytes is what this communicator has written to its peers, frame headers
// included.
func (t *TCP) WireBytes() int64 { return t.sent.Load() }

func (t *TCP) recv(p *peerConn, seq uint64, into []byte) error {
	p.c.SetReadDeadline(t.deadline)
	hdr := &p.rhdr
	if _, err := io.ReadFull(p.r, hdr[:]); err != nil {
		return t.lost(p, err)
	}
	if binary.LittleEndian.Uint32(hdr[0:]) != frameMagic {
		return &RankError{Op: "recv", Err: fmt.Errorf("%w: garbage from rank %d", ErrMismatch, p.rank)}
	}
	if s := binary.LittleEndian.Uint64(hdr[4:]); s != seq {
		return &RankError{Op: "recv", Err: fmt.Errorf("%w: rank %d is at collective %d, this rank at %d", ErrMismatch, p.rank, s, seq)}
	}
	if n := binary.LittleEndian.Uint64(hdr[12:]); n != uint64(len(into)) {
		return &RankError{Op: "recv", Err: fmt.Errorf("%w: rank %d sent %d bytes, %d expected", ErrMismatch, p.rank, n, len(into))}
	}
	if _, err := io.ReadFull(p.r, into); err != nil {
		return t.lost(p, err)
	}
	return nil
}

// lost names the peer a connection failure came from.
func (t *TCP) lost(p *peerConn, err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		err = fmt.Errorf("%w: %v", ErrTimeout, err)
	}
	return &RankError{Op: "tcp", Missing: []int{p.rank}, Err: err}
}

// maxFrame is the most one frame carries: larger transfers go as several frames,
// so neither side buffers more than this at once beyond the tensors themselves.
const maxFrame = 1 << 20

// exchange sends out to one peer while receiving into in from another (a ring
// step), in frames of at most maxFrame bytes. out and in must not overlap.
func (t *TCP) exchange(to *peerConn, out []float32, from *peerConn, in []float32) error {
	seq := t.seq
	t.seq++
	t.sendAsync(to, seq, f32bytes(out))
	rerr := t.recvF32(from, seq, in)
	serr := to.wait()
	if rerr != nil {
		return rerr
	}
	return serr
}

// The wire carries little-endian float32. On little-endian machines a []float32
// already is that byte sequence, so it is sent and received in place (no copy);
// elsewhere values are converted.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// f32bytes returns x as wire bytes: a view of x when possible, else a copy.
func f32bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
	}
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// recvF32 receives wire bytes into dst (directly when the layout allows).
func (t *TCP) recvF32(p *peerConn, seq uint64, dst []float32) error {
	if littleEndian {
		return t.recvFrames(p, seq, f32bytes(dst))
	}
	b := make([]byte, 4*len(dst))
	if err := t.recvFrames(p, seq, b); err != nil {
		return err
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return nil
}

// sendFrames and recvFrames move a payload as frames of at most maxFrame bytes.
func (t *TCP) sendFrames(p *peerConn, seq uint64, b []byte) error {
	for off := 0; ; off += maxFrame {
		if err := t.send(p, seq, b[off:min(off+maxFrame, len(b))]); err != nil || off+maxFrame >= len(b) {
			return err
		}
	}
}

func (t *TCP) recvFrames(p *peerConn, seq uint64, b []byte) error {
	for off := 0; ; off += maxFrame {
		if err := t.recv(p, seq, b[off:min(off+maxFrame, len(b))]); err != nil || off+maxFrame >= len(b) {
			return err
		}
	}
}

// AllGather: a ring of n−1 steps; at step s rank r passes on chunk (r−s) mod n.
func (t *TCP) AllGather(dst, src []float32) error {
	if err := t.begin(); err != nil {
		return err
	}
	return t.end(t.allGather(dst, src))
}

func (t *TCP) allGather(dst, src []float32) error {
	L := len(src)
	if len(dst) != t.n*L {
		return &RankError{Op: "all_gather", Err: fmt.Errorf("%w: dst %d elements, want %d × %d", ErrMismatch, len(dst), t.n, L)}
	}
	if L > 0 && &dst[t.rank*L] != &src[0] {
		copy(dst[t.rank*L:], src)
	}
	next, prev := t.peers[(t.rank+1)%t.n], t.peers[(t.rank-1+t.n)%t.n]
	for s := 0; s < t.n-1; s++ {
		sendC, recvC := (t.rank-s+t.n)%t.n, (t.rank-s-1+2*t.n)%t.n
		if err := t.exchange(next, dst[sendC*L:(sendC+1)*L], prev, dst[recvC*L:(recvC+1)*L]); err != nil {
			return err
		}
	}
	return nil
}

// ReduceScatter: a ring of n−1 steps; chunk c is summed along the ring starting
// after rank c, a fixed order, so results repeat bit for bit.
func (t *TCP) ReduceScatter(dst, src []float32) error {
	if err := t.begin(); err != nil {
		return err
	}
	return t.end(t.reduceScatter(dst, src))
}

func (t *TCP) reduceScatter(dst, src []float32) error {
	L := len(dst)
	if len(src) != t.n*L {
		return &RankError{Op: "reduce_scatter", Err: fmt.Errorf("%w: src %d elements, want %d × %d", ErrMismatch, len(src), t.n, L)}
	}
	if t.n == 1 {
		copy(dst, src)
		return nil
	}
	// Two chunk buffers: the partial sum being sent, and the one arriving (to which
	// this rank adds its own chunk before passing it on).
	first := (t.rank - 1 + t.n) % t.n
	if cap(t.rsBuf[0]) < L {
		t.rsBuf = [2][]float32{make([]float32, L), make([]float32, L)}
	}
	cur, got := t.rsBuf[0][:L], t.rsBuf[1][:L]
	copy(cur, src[first*L:(first+1)*L])
	next, prev := t.peers[(t.rank+1)%t.n], t.peers[(t.rank-1+t.n)%t.n]
	for s := 0; s < t.n-1; s++ {
		recvC := (t.rank - s - 2 + 2*t.n) % t.n
		if err := t.exchange(next, cur, prev, got); err != nil {
			return err
		}
		for i, v := range src[recvC*L : (recvC+1)*L] {
			got[i] += v
		}
		cur, got = got, cur
	}
	copy(dst, cur)
	return nil
}

// AllReduce is a reduce-scatter then an all-gather over n equal chunks (padded).
func (t *TCP) AllReduce(buf []float32) error {
	if t.n == 1 {
		return nil
	}
	if err := t.begin(); err != nil {
		return err
	}
	L := (len(buf) + t.n - 1) / t.n
	if cap(t.arBuf) < (t.n+1)*L {
		t.arBuf = make([]float32, (t.n+1)*L)
	}
	padded, part := t.arBuf[:t.n*L], t.arBuf[t.n*L:(t.n+1)*L]
	copy(padded, buf)
	clear(padded[len(buf):])
	if err := t.reduceScatter(part, padded); err != nil {
		return t.end(err)
	}
	if err := t.allGather(padded, part); err != nil {
		return t.end(err)
	}
	copy(buf, padded)
	return nil
}

// AllToAll exchanges with every peer pairwise, all at once.
func (t *TCP) AllToAll(dst, src []float32, send, recv []int) error {
	if len(send) != t.n || len(recv) != t.n || sum(send) > len(src) || sum(recv) > len(dst) {
		return &RankError{Op: "all_to_all", Err: fmt.Errorf("%w: counts do not fit the buffers", ErrMismatch)}
	}
	if err := t.begin(); err != nil {
		return err
	}
	seq := t.seq
	t.seq++
	// Every send starts at once on its peer's sender; the receives follow in rank
	// order (a sender blocked on a full socket holds up no one else).
	var own []float32
	soff := 0
	for j := 0; j < t.n; j++ {
		s := src[soff : soff+send[j]]
		soff += send[j]
		if j == t.rank {
			own = s
		} else {
			t.sendAsync(t.peers[j], seq, f32bytes(s))
		}
	}
	roff := 0
	return t.end(t.finishPairwise(func(j int) error { // j = 0, 1, … in order
		r := dst[roff : roff+recv[j]]
		roff += recv[j]
		if j == t.rank {
			copy(r, own)
			return nil
		}
		return t.recvF32(t.peers[j], seq, r)
	}))
}

// finishPairwise runs recv(j) for every rank j in order (the receives of a
// collective whose sends sendAsync started to every peer), then waits for the
// sends, and returns the first error.
func (t *TCP) finishPairwise(recv func(j int) error) error {
	var first error
	for j := 0; j < t.n; j++ {
		if err := recv(j); err != nil && first == nil {
			first = err
		}
	}
	for j, p := range t.peers {
		if j == t.rank {
			continue
		}
		if err := p.wait(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// SendRecv sends src to one peer while receiving dst from another. Every member
// of the group takes the step (it has the group's next sequence number); a peer
// that sends another length is named in the error.
func (t *TCP) SendRecv(dst, src []float32, to, from int) error {
	if to < 0 || to >= t.n || from < 0 || from >= t.n {
		return &RankError{Op: "send_recv", Err: fmt.Errorf("%w: to %d, from %d in a group of %d", ErrMismatch, to, from, t.n)}
	}
	if err := t.begin(); err != nil {
		return err
	}
	if to == t.rank || from == t.rank {
		if to != from {
			return t.end(&RankError{Op: "send_recv", Err: fmt.Errorf("%w: rank %d sends to %d but receives from %d", ErrMismatch, t.rank, to, from)})
		}
		t.seq++
		copy(dst, src)
		return nil
	}
	return t.end(t.exchange(t.peers[to], src, t.peers[from], dst))
}

// Broadcast: root sends to every other rank.
func (t *TCP) Broadcast(buf []float32, root int) error {
	if root < 0 || root >= t.n {
		return &RankError{Op: "broadcast", Err: fmt.Errorf("%w: root %d", ErrMismatch, root)}
	}
	if err := t.begin(); err != nil {
		return err
	}
	seq := t.seq
	t.seq++
	if t.rank != root {
		return t.end(t.recvF32(t.peers[root], seq, buf))
	}
	out := f32bytes(buf)
	for j, p := range t.peers {
		if j != root {
			if err := t.sendFrames(p, seq, out); err != nil {
				return t.end(err)
			}
		}
	}
	return nil
}

// ReduceScatterBF16 sends every peer its chunk in bf16 (2 bytes a value on the
// wire, all peers at once) and sums the n chunks it receives in fp32, in rank
// order, rounding once: what the in-process communicator computes, bit for bit.
func (t *TCP) ReduceScatterBF16(dst, src []uint16) error {
	L := len(dst)
	if len(src) != t.n*L {
		return &RankError{Op: "reduce_scatter_bf16", Err: fmt.Errorf("%w: src %d elements, want %d × %d", ErrMismatch, len(src), t.n, L)}
	}
	if err := t.begin(); err != nil {
		return err
	}
	if cap(t.bfBuf) < t.n*L {
		t.bfBuf = make([]uint16, t.n*L)
	}
	got := t.bfBuf[:t.n*L]
	err := t.pairwise(func(j int) ([]byte, []byte) {
		return u16wire(src[j*L : (j+1)*L]), u16view(got[j*L : (j+1)*L])
	})
	if err != nil {
		return t.end(err)
	}
	for j := 0; j < t.n; j++ {
		fromWire16(got[j*L : (j+1)*L])
	}
	copy(got[t.rank*L:(t.rank+1)*L], src[t.rank*L:(t.rank+1)*L])
	for i := range dst {
		var acc float32
		for r := 0; r < t.n; r++ {
			acc += bf16ToF32(got[r*L+i])
		}
		dst[i] = f32ToBF16(acc)
	}
	return nil
}

// AllGatherBF16 gathers bf16 values, 2 bytes a value on the wire, every peer's
// chunk at once.
func (t *TCP) AllGatherBF16(dst, src []uint16) error {
	L := len(src)
	if len(dst) != t.n*L {
		return &RankError{Op: "all_gather_bf16", Err: fmt.Errorf("%w: dst %d elements, want %d × %d", ErrMismatch, len(dst), t.n, L)}
	}
	if err := t.begin(); err != nil {
		return err
	}
	out := u16wire(src)
	err := t.pairwise(func(j int) ([]byte, []byte) { return out, u16view(dst[j*L : (j+1)*L]) })
	if err != nil {
		return t.end(err)
	}
	for j := 0; j < t.n; j++ { // the peers' chunks came in wire order; src may be dst's own chunk (in place)
		if j != t.rank {
			fromWire16(dst[j*L : (j+1)*L])
		}
	}
	if L > 0 && &dst[t.rank*L] != &src[0] {
		copy(dst[t.rank*L:(t.rank+1)*L], src)
	}
	return nil
}

// pairwise sends out(j) to every peer j while receiving in(j) from it, all peers
// at once, as one collective (one sequence number).
func (t *TCP) pairwise(bufs func(j int) (out, in []byte)) error {
	seq := t.seq
	t.seq++
	for j := 0; j < t.n; j++ {
		if j != t.rank {
			out, _ := bufs(j)
			t.sendAsync(t.peers[j], seq, out)
		}
	}
	return t.finishPairwise(func(j int) error {
		if j == t.rank {
			return nil
		}
		_, in := bufs(j)
		return t.recvFrames(t.peers[j], seq, in)
	})
}

// The wire carries little-endian bf16 bit patterns. u16view is x's bytes in place
// (what a receive fills); u16wire is x as wire bytes (a view on a little-endian
// machine, else a converted copy); fromWire16 turns received bytes into native
// values in place (nothing to do on a little-endian machine).
func u16view(x []uint16) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 2*len(x))
}

func u16wire(x []uint16) []byte {
	if littleEndian {
		return u16view(x)
	}
	b := make([]byte, 2*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return b
}

func fromWire16(x []uint16) {
	if littleEndian {
		return
	}
	b := u16view(x)
	for i := range x {
		x[i] = binary.LittleEndian.Uint16(b[2*i:]) // reads element i's two bytes before writing them
	}
}

func (t *TCP) Barrier() error { return t.AllReduce(t.barrier[:]) }

var _ Communicator = (*TCP)(nil)
