package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "workmesh:", err)
		os.Exit(exitCode(err))
	}
}
