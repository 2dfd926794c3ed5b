package comm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"testing"
	"time"
)

// FuzzHandshake: any bytes a connection opens with, read as the rendezvous and
// the peer listeners read them (the fixed preamble, then a join's address), are
// accepted or refused, never a panic; what is accepted presented this job's
// token, and nothing is read past the preamble and at most 1+maxAddr bytes.
func FuzzHandshake(f *testing.F) {
	token := tokenDigest("job")
	var join bytes.Buffer
	writeJoin(&join, token, 1, 4, "127.0.0.1:40000")
	f.Add(join.Bytes())
	f.Add(preamble{kind: kindPeer, rank: 2, world: 4, group: groupDigest("world")}.encode(token))
	f.Add(preamble{kind: kindJoin, rank: 1, world: 4}.encode(tokenDigest("another job")))
	f.Add(strangerBytes())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		var buf [preambleSize]byte
		p, err := readPreamble(r, token, &buf)
		if err != nil {
			if errors.Is(err, errWrongToken) && bytes.Equal(in[8:40], token[:]) {
				t.Fatal("the right token refused")
			}
			return
		}
		if !bytes.Equal(in[8:40], token[:]) {
			t.Fatal("a wrong token accepted")
		}
		if p.kind == kindJoin {
			addr, err := readAddr(r)
			if err == nil && len(addr) > maxAddr {
				t.Fatalf("address of %d bytes accepted", len(addr))
			}
		}
		if read := len(in) - r.Len(); read > preambleSize+1+maxAddr {
			t.Fatalf("read %d bytes of a handshake", read)
		}
	})
}

// FuzzRendezvousAnswer: any bytes as the rendezvous's answer to a joining rank
// give the peer table (world valid addresses) or an error, never a panic, and
// nothing beyond the table's or the refusal's bound is read.
func FuzzRendezvousAnswer(f *testing.F) {
	var table bytes.Buffer
	writeAnswer(&table, []string{"127.0.0.1:1", "127.0.0.1:2", "[::1]:3"})
	f.Add(uint8(3), table.Bytes())
	var refusal bytes.Buffer
	writeRefusal(&refusal, "wrong job token")
	f.Add(uint8(2), refusal.Bytes())
	f.Add(uint8(1), []byte{answerRefused, 0xff, 0xff})
	f.Add(uint8(0), []byte{})
	f.Fuzz(func(t *testing.T, world uint8, in []byte) {
		r := bytes.NewReader(in)
		addrs, err := readAnswer(r, int(world))
		if read := len(in) - r.Len(); read > 3+maxRefusal && read > 1+int(world)*(1+maxAddr) {
			t.Fatalf("read %d bytes of an answer for a world of %d", read, world)
		}
		if err != nil {
			return
		}
		if len(addrs) != int(world) {
			t.Fatalf("%d addresses for a world of %d", len(addrs), world)
		}
		for _, a := range addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				t.Fatalf("address %q accepted: %v", a, err)
			}
		}
	})
}

// FuzzPeerFrame: any bytes from a peer, received as a collective's frames of an
// expected length, fill the buffer or fail the receive, never a panic and never
// more than the buffer (each frame's length is checked against what the
// collective needs before its payload is read).
func FuzzPeerFrame(f *testing.F) {
	frame := func(seq uint64, payload []byte) []byte {
		b := make([]byte, 20, 20+len(payload))
		binary.LittleEndian.PutUint32(b[0:], frameMagic)
		binary.LittleEndian.PutUint64(b[4:], seq)
		binary.LittleEndian.PutUint64(b[12:], uint64(len(payload)))
		return append(b, payload...)
	}
	f.Add(uint16(8), frame(0, make([]byte, 8)))
	f.Add(uint16(8), frame(1, make([]byte, 8)))
	f.Add(uint16(8), frame(0, make([]byte, 9)))
	huge := frame(0, nil)
	binary.LittleEndian.PutUint64(huge[12:], 1<<62)
	f.Add(uint16(8), huge)
	f.Add(uint16(0), frame(0, nil))
	f.Fuzz(func(t *testing.T, want uint16, in []byte) {
		a, b := net.Pipe()
		defer a.Close()
		go func() {
			b.Write(in)
			b.Close()
		}()
		tc := &TCP{deadline: time.Now().Add(10 * time.Second)}
		p := newPeer(1, a)
		into := make([]byte, int(want)+1)
		err := tc.recvFrames(p, 0, into[:want])
		if into[want] != 0 {
			t.Fatal("a frame wrote past the buffer")
		}
		if err == nil && (len(in) < 20+int(want) || !bytes.Equal(into[:want], in[20:20+int(want)])) {
			t.Fatal("a receive succeeded without the frame that fills it")
		}
	})
}

// FuzzAgreeFacts: any bytes as a rank's facts (what Agree gathers from the
// others) decode or are refused, never a panic, and what decodes encodes to
// bytes that decode to the same facts.
func FuzzAgreeFacts(f *testing.F) {
	f.Add(encodeFacts([]Fact{{"model.hidden", "64"}, {"data", "sha256:aa"}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		facts, err := decodeFacts(in)
		if err != nil {
			return
		}
		again, err := decodeFacts(encodeFacts(facts))
		if err != nil || !slices.Equal(again, facts) {
			t.Fatalf("%q decodes to %q, which round-trips to %q (%v)", in, facts, again, err)
		}
	})
}
