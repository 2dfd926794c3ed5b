package trainer

import (
	"unsafe"

	"github.com/shardline/shardline/tensor"
)

// unsafeBF16 reinterprets bf16 bit patterns (as comm carries them) as tensor.BF16,
// which has the same size and layout: no copy.
func unsafeBF16(u []uint16) []tensor.BF16 {
	if len(u) == 0 {
		return nil
	}
	return unsafe.Slice((*tensor.BF16)(unsafe.Pointer(&u[0])), len(u))
}

// bf16Bits is unsafeBF16's inverse: bf16 values as the bit patterns comm carries.
func bf16Bits(h []tensor.BF16) []uint16 {
	if len(h) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&h[0])), len(h))
}
