//go:build cuda

package cuda

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"
)

// openLibrary loads the first of names that open (a loader of the cgo preamble:
// dlopen and dlsym of what it needs, returning NULL or what failed) takes, and
// returns its name; where none loads, an error naming what, every attempt's
// failure, and fix.
func openLibrary(what string, names []string, open func(*C.char) *C.char, fix string) (string, error) {
	var why []string
	for _, name := range names {
		cs := C.CString(name)
		msg := open(cs)
		C.free(unsafe.Pointer(cs))
		if msg == nil {
			return name, nil
		}
		why = append(why, C.GoString(msg))
	}
	return "", fmt.Errorf("cuda: %s not found (tried %s): %s; %s", what, strings.Join(names, ", "), strings.Join(why, "; "), fix)
}
