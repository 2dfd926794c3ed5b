package main

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/tiktoken-go/tokenizer/codec"
)

func main() {
	c := codec.NewR50kBase()
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	for id := uint(0); id < 50256; id++ {
		s, err := c.Decode([]uint{id})
		if err != nil {
			fmt.Fprintln(os.Stderr, "gpt2vocab:", err)
			os.Exit(1)
		}
		fmt.Fprintf(w, "%d %s\n", id, hex.EncodeToString([]byte(s)))
	}
}
