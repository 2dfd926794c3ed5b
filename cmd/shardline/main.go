// Command shardline trains decoder-only language models from TOML recipes; see
// doc.go and `shardline --help`.
package main

import (
	"io"
	"os"
)

func main() {
	var stdout io.Writer = os.Stdout
	var term *terminalWriter
	if isTerminal(os.Stdout) {
		term = &terminalWriter{w: os.Stdout}
		stdout = term
	}
	code := Main(os.Args[1:], stdout, os.Stderr, os.Environ())
	if term != nil {
		term.Flush()
	}
	os.Exit(code)
}
