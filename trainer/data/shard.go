package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// Shard file layout, little-endian:
//
//	magic    [8]byte "SHLTOKEN"
//	version  uint32  1
//	dtype    uint32  2 (uint16 tokens) or 4 (uint32 tokens)
//	count    uint64  number of tokens
//	tokname  [16]byte tokenizer name, zero-padded
//	tokens   count × dtype bytes
const (
	shardMagic   = "SHLTOKEN"
	shardVersion = 1
	headerSize   = 8 + 4 + 4 + 8 + 16
)

// WriteShard writes tokens to path.
func WriteShard(path string, tokens []int32, tokenizer string, vocab int) error {
	dtype := uint32(2)
	if vocab > 1<<16 {
		dtype = 4
	}
	buf := make([]byte, headerSize, headerSize+len(tokens)*int(dtype))
	copy(buf, shardMagic)
	binary.LittleEndian.PutUint32(buf[8:], shardVersion)
	binary.LittleEndian.PutUint32(buf[12:], dtype)
	binary.LittleEndian.PutUint64(buf[16:], uint64(len(tokens)))
	copy(buf[24:40], tokenizer)
	for _, t := range tokens {
		if dtype == 2 {
			buf = binary.LittleEndian.AppendUint16(buf, uint16(t))
		} else {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ErrNotShard marks a file that is not a token shard.
var ErrNotShard = errors.New("not a shardline token shard")

// ReadShard reads a shard, checking its header against the file's size.
func ReadShard(path string) (tokens []int32, tokenizer string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, "", err
	}
	var h [headerSize]byte
	if _, err := io.ReadFull(f, h[:]); err != nil || string(h[:8]) != shardMagic {
		return nil, "", fmt.Errorf("%s: %w (bad header)", path, ErrNotShard)
	}
	if v := binary.LittleEndian.Uint32(h[8:]); v != shardVersion {
		return nil, "", fmt.Errorf("%s: shard version %d, this shardline reads version %d", path, v, shardVersion)
	}
	dtype, count := binary.LittleEndian.Uint32(h[12:]), binary.LittleEndian.Uint64(h[16:])
	if dtype != 2 && dtype != 4 {
		return nil, "", fmt.Errorf("%s: %w (token size %d)", path, ErrNotShard, dtype)
	}
	if want := int64(headerSize) + int64(count)*int64(dtype); count > 1<<40 || st.Size() != want {
		return nil, "", fmt.Errorf("%s: header says %d tokens (%d bytes) but the file has %d bytes", path, count, want, st.Size())
	}
	body := make([]byte, int(count)*int(dtype))
	if _, err := io.ReadFull(f, body); err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	tokens = make([]int32, count)
	for i := range tokens {
		if dtype == 2 {
			tokens[i] = int32(binary.LittleEndian.Uint16(body[2*i:]))
		} else {
			tokens[i] = int32(binary.LittleEndian.Uint32(body[4*i:]))
		}
	}
	name := string(h[24:40])
	for i, c := range name {
		if c == 0 {
			name = name[:i]
			break
		}
	}
	return tokens, name, nil
}
