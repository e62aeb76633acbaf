// Command workmesh-embed-example is a Go program that embeds a workmesh
// node and serves a work type of its own, "reverse" (the payload's bytes
// in reverse order), to the network it joins:
//
//	workmesh-embed-example --bootstrap /ip4/127.0.0.1/udp/4001/quic-v1/p2p/12D3...
//
// It prints its peer ID, API address and "ready", serves work until
// SIGINT or SIGTERM, then drains and stops. The wiring is the project's
// (workers/stack); the program adds only its handler.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/stack"
)

// reverse is the program's own work: it has no side effects, so it may
// be hedged, and the same payload always gives the same result.
type reverse struct{}

func (reverse) Do(_ context.Context, payload []byte) workers.Result {
	out := make([]byte, len(payload))
	for i, b := range payload {
		out[len(payload)-1-i] = b
	}
	return workers.OK(out)
}

func (reverse) Traits() workers.Traits {
	return workers.Traits{Idempotent: workers.Always, Deterministic: true}
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "workmesh-embed-example:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := config.Defaults()
	network := flag.String("network", cfg.Node.Network, "the network to join")
	bootstrap := flag.String("bootstrap", "", "peers to join through, comma-separated multiaddrs with /p2p/<id>")
	listen := flag.String("listen", "/ip4/127.0.0.1/udp/0/quic-v1", "multiaddr to listen on")
	api := flag.String("api", "127.0.0.1:0", "address of the local HTTP API")
	dataDir := flag.String("data-dir", "", "where the node keeps its identity (default $HOME/.workmesh)")
	flag.Parse()

	cfg.Node.Network, cfg.Node.API, cfg.Node.DataDir = *network, *api, *dataDir
	cfg.Node.Listen = []string{*listen}
	if *bootstrap != "" {
		cfg.Node.Bootstrap = strings.Split(*bootstrap, ",")
	}
	cfg.Node.WorkTypes = []string{"reverse"}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := logrus.New()
	log.SetOutput(os.Stderr)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := stack.Start(ctx, cfg, log, stack.WithHandler("reverse", reverse{}))
	if err != nil {
		return err
	}
	fmt.Printf("peer id: %s\napi: %s\nready\n", s.Node().ID(), s.Node().APIAddr())
	<-ctx.Done()
	s.Drain(5 * time.Second)
	return s.CloseWithin(10 * time.Second)
}
