package comm

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// The handshake: the first bytes of every connection a rank opens (to the
// rendezvous, or to a peer for a group) are a preamble of fixed size that proves
// the job token before anything the other side chose the size of is read or
// allocated:
//
//	magic "SHLJ" | version | kind | 2 zero bytes | SHA-256 of the token |
//	rank (uint32) | world (uint32) | group (SHA-256 of the group key; zero to join)
//
// all little-endian, preambleSize bytes. A rank joining the rendezvous follows it
// with its address (one length byte, at most maxAddr bytes). The rendezvous
// answers with a status byte and either the peer table (world × one length byte
// and an address, which the joining rank bounds by the world it knows) or a
// refusal (two length bytes, at most maxRefusal bytes of text).
const (
	helloMagic      = 0x4a4c4853 // "SHLJ"
	helloVersion    = 1
	kindJoin        = 1 // a rank introducing itself at the rendezvous
	kindPeer        = 2 // a rank opening a group's connection to a peer
	preambleSize    = 4 + 1 + 1 + 2 + sha256.Size + 4 + 4 + sha256.Size
	maxAddr         = 255  // host:port of a rank's listener
	maxRefusal      = 1024 // the rendezvous's reason for refusing a rank
	answerPeers     = 0    // the answer's status: the peer table follows
	answerRefused   = 1    // the answer's status: a refusal follows
	tokenDigestSalt = "shardline job token\x00"
)

// maxHandshakes is how many connections a listener (the rendezvous, a rank's
// peer listener) holds at once before they have proved the token: further ones
// wait in the kernel's accept queue until a handshake ends (it ends within
// helloTimeout), so a flood of strangers costs at most this many goroutines and
// preambles, and no unbounded memory.
const maxHandshakes = 64

// errNotShardline marks a connection whose first bytes are not a shardline
// preamble; errWrongToken one that presents another job's token.
var (
	errNotShardline = errors.New("not a shardline preamble")
	errWrongToken   = errors.New("wrong job token")
)

// preamble is the fixed-size start of a connection.
type preamble struct {
	kind        byte
	rank, world uint32
	group       [sha256.Size]byte // kindPeer: groupDigest of the group's key
}

func tokenDigest(token string) [sha256.Size]byte {
	return sha256.Sum256([]byte(tokenDigestSalt + token))
}

func groupDigest(key string) [sha256.Size]byte { return sha256.Sum256([]byte(key)) }

// encode writes the preamble, proving token.
func (p preamble) encode(token [sha256.Size]byte) []byte {
	b := make([]byte, preambleSize)
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	b[4], b[5] = helloVersion, p.kind
	copy(b[8:], token[:])
	binary.LittleEndian.PutUint32(b[40:], p.rank)
	binary.LittleEndian.PutUint32(b[44:], p.world)
	copy(b[48:], p.group[:])
	return b
}

// readPreamble reads exactly preambleSize bytes into buf and checks the magic, the version and, in
// constant time, the token digest. The preamble is returned even when the token
// is wrong (errWrongToken), so the rendezvous can say what it refused.
func readPreamble(r io.Reader, token [sha256.Size]byte, buf *[preambleSize]byte) (preamble, error) {
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return preamble{}, err
	}
	if binary.LittleEndian.Uint32(buf[0:]) != helloMagic || buf[6] != 0 || buf[7] != 0 {
		return preamble{}, errNotShardline
	}
	if buf[4] != helloVersion {
		return preamble{}, fmt.Errorf("%w: handshake version %d, this build speaks %d (run the same shardline on every rank)", errNotShardline, buf[4], helloVersion)
	}
	p := preamble{kind: buf[5], rank: binary.LittleEndian.Uint32(buf[40:]), world: binary.LittleEndian.Uint32(buf[44:])}
	copy(p.group[:], buf[48:])
	if p.kind != kindJoin && p.kind != kindPeer {
		return preamble{}, fmt.Errorf("%w: connection kind %d", errNotShardline, p.kind)
	}
	if subtle.ConstantTimeCompare(buf[8:40], token[:]) != 1 {
		return p, errWrongToken
	}
	return p, nil
}

// writeJoin is a joining rank's preamble and its address.
func writeJoin(w io.Writer, token [sha256.Size]byte, rank, world int, addr string) error {
	if len(addr) > maxAddr {
		return fmt.Errorf("comm: listener address %q is longer than %d bytes", addr, maxAddr)
	}
	b := append(preamble{kind: kindJoin, rank: uint32(rank), world: uint32(world)}.encode(token), byte(len(addr)))
	_, err := w.Write(append(b, addr...))
	return err
}

// readAddr reads the length byte and address that follow a join preamble: at
// most maxAddr bytes, the bound being the length byte itself.
func readAddr(r io.Reader) (string, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	b := make([]byte, n[0])
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	if _, _, err := net.SplitHostPort(string(b)); err != nil {
		return "", fmt.Errorf("%w: address %q: %v", errNotShardline, b, err)
	}
	return string(b), nil
}

// writeAnswer sends a joined rank the peer table.
func writeAnswer(w io.Writer, addrs []string) error {
	b := []byte{answerPeers}
	for _, a := range addrs {
		b = append(append(b, byte(len(a))), a...) // each checked by readAddr when it joined
	}
	_, err := w.Write(b)
	return err
}

// writeRefusal tells a connection why the rendezvous turned it away.
func writeRefusal(w io.Writer, why string) error {
	if len(why) > maxRefusal {
		why = why[:maxRefusal]
	}
	b := []byte{answerRefused, 0, 0}
	binary.LittleEndian.PutUint16(b[1:], uint16(len(why)))
	_, err := w.Write(append(b, why...))
	return err
}

// readAnswer reads the rendezvous's answer to a rank of a world of world ranks:
// the peer table (world addresses of at most maxAddr bytes each, so at most
// world × (maxAddr+1) bytes), or a refusal (ErrRefused and its reason, at most
// maxRefusal bytes). Nothing larger than those bounds is read.
func readAnswer(r io.Reader, world int) ([]string, error) {
	var status [1]byte
	if _, err := io.ReadFull(r, status[:]); err != nil {
		return nil, err
	}
	switch status[0] {
	case answerPeers:
		addrs := make([]string, world)
		for i := range addrs {
			a, err := readAddr(r)
			if err != nil {
				return nil, fmt.Errorf("malformed peer table: entry %d: %w", i, err)
			}
			addrs[i] = a
		}
		return addrs, nil
	case answerRefused:
		var n [2]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return nil, err
		}
		l := binary.LittleEndian.Uint16(n[:])
		if l > maxRefusal {
			return nil, fmt.Errorf("malformed refusal of %d bytes (at most %d)", l, maxRefusal)
		}
		why := make([]byte, l)
		if _, err := io.ReadFull(r, why); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %s", ErrRefused, why)
	}
	return nil, fmt.Errorf("%w: answer status %d", errNotShardline, status[0])
}

// gate bounds the connections a listener is authenticating at once
// (maxHandshakes); peak is the most it held, which tests read.
type gate struct {
	slots   chan struct{}
	n, peak atomic.Int32
}

func newGate() *gate { return &gate{slots: make(chan struct{}, maxHandshakes)} }

// enter waits for a free slot.
func (g *gate) enter() {
	g.slots <- struct{}{}
	n := g.n.Add(1)
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
}

// leave frees a slot.
func (g *gate) leave() {
	g.n.Add(-1)
	<-g.slots
}

// acceptGated accepts connections from ln, at most maxHandshakes of them being
// handled at once, each handed to handle with deadline as its deadline (the
// handshake's); it returns when ln is closed. Any other accept error (out of
// file descriptors) is retried after a pause growing to a second, as net/http
// does, so that it does not end the listener for good.
func acceptGated(ln net.Listener, g *gate, deadline func() time.Time, handle func(net.Conn)) {
	var pause time.Duration
	for {
		g.enter()
		c, err := ln.Accept()
		if err != nil {
			g.leave()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			time.Sleep(pause)
			continue
		}
		pause = 0
		go func() {
			defer g.leave()
			c.SetDeadline(deadline())
			handle(c)
		}()
	}
}
