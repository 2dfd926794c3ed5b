package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

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
	// MaxShardTokens caps what one shard file holds (ReadShard reads one
	// whole); Prepare writes shards of shardTokens, and a corpus is any number
	// of shards.
	MaxShardTokens = 1 << 31
)

// WriteShard writes tokens (each below vocab) to path, atomically.
func WriteShard(path string, tokens []int32, tokenizer string, vocab int) error {
	width := tokenWidth(vocab)
	body := make([]byte, 0, len(tokens)*width)
	for _, t := range tokens {
		if width == 2 {
			body = binary.LittleEndian.AppendUint16(body, uint16(t))
		} else {
			body = binary.LittleEndian.AppendUint32(body, uint32(t))
		}
	}
	return writeShardBytes(path, body, width, tokenizer, vocab)
}

// writeShardBytes writes a shard whose tokens are already encoded (width bytes
// each) in body, atomically.
func writeShardBytes(path string, body []byte, width int, tokenizer string, vocab int) error {
	h := make([]byte, headerSize)
	copy(h, shardMagic)
	binary.LittleEndian.PutUint32(h[8:], shardVersion)
	binary.LittleEndian.PutUint32(h[12:], uint32(width))
	binary.LittleEndian.PutUint64(h[16:], uint64(len(body)/width))
	copy(h[24:40], tokenizer)
	binary.LittleEndian.PutUint32(h[40:], uint32(vocab))
	w, err := fileio.CreateSealed(path, int64(headerSize+len(body)))
	if err != nil {
		return err
	}
	if err := w.WriteAt(h, 0); err != nil {
		w.Abort()
		return err
	}
	if err := w.WriteAt(body, headerSize); err != nil {
		w.Abort()
		return err
	}
	return w.Commit()
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

// ReadShard reads a shard, checking its header against the file's size before
// reading the rest (a header's token count never sets what is read), then its
// checksum, and every token against its vocabulary.
func ReadShard(path string) (*Shard, error) {
	size, err := checkShardHeader(path)
	if err != nil {
		return nil, err
	}
	b, err := fileio.ReadSealed(path, size)
	if err != nil {
		return nil, err
	}
	if len(b) < headerSize {
		return nil, fmt.Errorf("%s: %w (it changed while being read)", path, ErrNotShard)
	}
	dtype, count := binary.LittleEndian.Uint32(b[12:]), binary.LittleEndian.Uint64(b[16:])
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

// checkShardHeader reads a shard's header alone and checks it: the magic, the
// version, the token size, a count of at most MaxShardTokens, and that the
// file holds exactly the header, the tokens it counts and the trailer. It
// returns the file's size.
func checkShardHeader(path string) (int64, error) {
	f, size, err := fileio.OpenRegular(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h := make([]byte, headerSize)
	if _, err := io.ReadFull(f, h); err != nil || string(h[:8]) != shardMagic {
		return 0, fmt.Errorf("%s: %w: %w (no shard header in its first %d bytes)", path, fileio.ErrCorrupt, ErrNotShard, headerSize)
	}
	if v := binary.LittleEndian.Uint32(h[8:]); v != shardVersion {
		return 0, fmt.Errorf("%s: shard version %d, this shardline reads version %d; prepare the data again with `shardline data prepare`", path, v, shardVersion)
	}
	dtype, count := binary.LittleEndian.Uint32(h[12:]), binary.LittleEndian.Uint64(h[16:])
	if dtype != 2 && dtype != 4 {
		return 0, fmt.Errorf("%s: %w (token size %d)", path, ErrNotShard, dtype)
	}
	if count > MaxShardTokens {
		return 0, fmt.Errorf("%s: %w: header says %d tokens, more than the %d a shard holds ", path, ErrNotShard, count, uint64(MaxShardTokens))
	}
	if want := int64(headerSize) + int64(count)*int64(dtype) + fileio.TrailerSize; size != want {
		return 0, fmt.Errorf("%s: %w: header says %d tokens (%d bytes with header and trailer) but the file holds %d (truncated or extended)", path, fileio.ErrCorrupt, count, want, size)
	}
	return size, nil
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
