// Command workmesh runs and talks to a workmesh node: a peer-to-peer
// worker-dispatch node that joins a libp2p network, advertises what work it
// can do and sends submitted work to the best remote worker or its own.
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
