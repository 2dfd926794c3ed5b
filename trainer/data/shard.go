package data

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/shardline/shardline/fileio"
)

// Shard file layout, little-endian, sealed by fileio (a CRC-32C trailer over
// everything before it):
//
//	magic    [8]byte "SHLTOKEN"
//	version  uint32  2
//	dtype    uint32  2 (uint16 tokens) or 4 (uint32 tokens)
//	count    uint64  number of tokens
//	tokname  [16]byte tokenizer name, zero-padded
//	vocab    uint32  vocabulary size: every token is below it
//	reserved uint32  0
//	tokens   count × dtype bytes
//	trailer  fileio.TrailerSize bytes
const (
	shardMagic   = "SHLTOKEN"
	shardVersion = 2
	headerSize   = 8 + 4 + 4 + 8 + 16 + 4 + 4
	// MaxShardTokens caps what one shard holds (16 GiB as int32 in memory).
	MaxShardTokens = 1 << 32
)

// WriteShard writes tokens (each below vocab) to path, atomically.
func WriteShard(path string, tokens []int32, tokenizer string, vocab int) error {
	dtype := uint32(2)
	if vocab > 1<<16 {
		dtype = 4
	}
	buf := make([]byte, headerSize, headerSize+len(tokens)*int(dtype)+fileio.TrailerSize)
	copy(buf, shardMagic)
	binary.LittleEndian.PutUint32(buf[8:], shardVersion)
	binary.LittleEndian.PutUint32(buf[12:], dtype)
	binary.LittleEndian.PutUint64(buf[16:], uint64(len(tokens)))
	copy(buf[24:40], tokenizer)
	binary.LittleEndian.PutUint32(buf[40:], uint32(vocab))
	for _, t := range tokens {
		if dtype == 2 {
			buf = binary.LittleEndian.AppendUint16(buf, uint16(t))
		} else {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
	}
	return fileio.WriteSealed(path, buf)
}

// ErrNotShard marks a file that is not a token shard.
var ErrNotShard = errors.New("not a shardline token shard")

// ErrBadToken marks a token id outside the shard's vocabulary.
var ErrBadToken = errors.New("token outside the vocabulary")

// Shard is a token shard as read: its tokens, the tokenizer that made them and
// the vocabulary every token is below.
type Shard struct {
	Tokens    []int32
	Tokenizer string
	Vocab     int
}

// ReadShard reads a shard, checking its checksum, its header against its size,
// and every token against its vocabulary.
func ReadShard(path string) (*Shard, error) {
	b, err := fileio.ReadSealed(path, headerSize+4*MaxShardTokens+fileio.TrailerSize)
	if err != nil {
		return nil, err
	}
	if len(b) < headerSize || string(b[:8]) != shardMagic {
		return nil, fmt.Errorf("%s: %w (bad header)", path, ErrNotShard)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != shardVersion {
		return nil, fmt.Errorf("%s: shard version %d, this shardline reads version %d; prepare the data again with `shardline data prepare`", path, v, shardVersion)
	}
	dtype, count := binary.LittleEndian.Uint32(b[12:]), binary.LittleEndian.Uint64(b[16:])
	if dtype != 2 && dtype != 4 {
		return nil, fmt.Errorf("%s: %w (token size %d)", path, ErrNotShard, dtype)
	}
	if want := uint64(headerSize) + count*uint64(dtype); count > MaxShardTokens || uint64(len(b)) != want {
		return nil, fmt.Errorf("%s: %w: header says %d tokens (%d bytes before the trailer) but the file holds %d", path, ErrNotShard, count, want, len(b))
	}
	s := &Shard{Tokenizer: cString(b[24:40]), Vocab: int(binary.LittleEndian.Uint32(b[40:])), Tokens: make([]int32, count)}
	body := b[headerSize:]
	for i := range s.Tokens {
		var t uint32
		if dtype == 2 {
			t = uint32(binary.LittleEndian.Uint16(body[2*i:]))
		} else {
			t = binary.LittleEndian.Uint32(body[4*i:])
		}
		if t >= uint32(s.Vocab) {
			return nil, fmt.Errorf("%s: %w: token %d at byte offset %d (token %d) is not below the vocabulary size %d", path, ErrBadToken, t, headerSize+int(dtype)*i, i, s.Vocab)
		}
		s.Tokens[i] = int32(t)
	}
	return s, nil
}

// cString is b up to its first zero byte.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
