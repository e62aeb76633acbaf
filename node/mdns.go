package node

import (
	"context"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	"github.com/sirupsen/logrus"
)

// mdnsDialTimeout bounds the dial of a peer found on the local network.
const mdnsDialTimeout = 5 * time.Second

// mdnsMaxDials bounds the dials of found peers under way at once; a peer
// found while they are taken is dialed when it is announced again.
const mdnsMaxDials = 8

// mdnsServiceName is the DNS-SD service a node of network announces and
// looks for: nodes of other networks on the LAN are not dialed.
func mdnsServiceName(network string) string { return "_workmesh-" + network + "._udp" }

// lanDiscovery finds peers of the node's network on the local network by
// multicast DNS (go-libp2p's mdns service) and dials each one found: the
// connection brings its record like any other (membership syncs it).
type lanDiscovery struct {
	h      host.Host
	log    logrus.FieldLogger
	svc    mdns.Service
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}
}

// startMDNS starts LAN discovery on h; Close stops it and the dials it
// started.
func startMDNS(h host.Host, network string, log logrus.FieldLogger) (*lanDiscovery, error) {
	ctx, cancel := context.WithCancel(context.Background())
	d := &lanDiscovery{h: h, log: log, ctx: ctx, cancel: cancel, sem: make(chan struct{}, mdnsMaxDials)}
	d.svc = mdns.NewMdnsService(h, mdnsServiceName(network), d)
	if err := d.svc.Start(); err != nil {
		cancel()
		return nil, err
	}
	return d, nil
}

// HandlePeerFound dials a peer the mdns service found, unless it is this
// node, already connected, or the dials at once are taken (mdns.Notifee).
func (d *lanDiscovery) HandlePeerFound(pi peer.AddrInfo) {
	if pi.ID == d.h.ID() || d.ctx.Err() != nil || len(d.h.Network().ConnsToPeer(pi.ID)) > 0 {
		return
	}
	select {
	case d.sem <- struct{}{}:
	default:
		return
	}
	d.wg.Go(func() {
		defer func() { <-d.sem }()
		ctx, cancel := context.WithTimeout(d.ctx, mdnsDialTimeout)
		defer cancel()
		if err := d.h.Connect(ctx, pi); err != nil {
			d.log.WithField("peer", pi.ID.String()).WithError(err).Debug("mdns: dial of a peer found on the local network failed")
			return
		}
		d.log.WithField("peer", pi.ID.String()).Debug("mdns: connected to a peer found on the local network")
	})
}

// Close stops the mdns service, then the dials under way.
func (d *lanDiscovery) Close() error {
	err := d.svc.Close()
	d.cancel()
	d.wg.Wait()
	return err
}
