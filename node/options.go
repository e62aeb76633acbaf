package node

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	lpubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/node/authority"
	"github.com/workmesh/workmesh/selection"
)

// Option configures a Node.
type Option func(*options) error

type apiHandler struct {
	pattern string
	h       http.Handler
}

type options struct {
	log        *logrus.Logger
	clock      selection.Clock
	state      LocalState
	version    string
	key        crypto.PrivKey
	handlers   []apiHandler
	gossipOpts []lpubsub.Option
	// gossipTopics are WithGossipTopics'.
	gossipTopics []string
	// healthCheck, when set, judges each health ping; see WithHealthCheck.
	healthCheck func(from peer.ID) error
	// apiToken is the bearer token the local API requires; empty means none.
	apiToken string
	// info adds fields to /v1/info; see WithInfo.
	info []infoSource
	// host, when set, is the libp2p host the node runs on instead of one
	// of its own; see WithHost.
	host host.Host
	// authority and cert make the network a closed one; see
	// WithMembership.
	authority authority.PublicKey
	cert      *authority.Certificate
}

// WithLogger sets the logger; the default is the standard logrus logger.
func WithLogger(log *logrus.Logger) Option {
	return func(o *options) error {
		if log == nil {
			return errors.New("node: nil logger")
		}
		o.log = log
		return nil
	}
}

// WithClock sets the clock the peer table judges freshness by.
func WithClock(c selection.Clock) Option {
	return func(o *options) error {
		if c == nil {
			return errors.New("node: nil clock")
		}
		o.clock = c
		return nil
	}
}

// WithLocalState sets where capacity, load and heads come from; without it
// the node advertises zero capacity and load and no heads.
func WithLocalState(s LocalState) Option {
	return func(o *options) error {
		if s == nil {
			return errors.New("node: nil local state")
		}
		o.state = s
		return nil
	}
}

// WithHealthCheck has the node ask check, once per health ping, whether its
// worker can work now (check gets the pinging peer, and must be quick). A
// non-nil error is answered to the ping (HealthAnswer.Error: the pinging
// peer counts a failed poll), or, when it wraps ErrHealthDropped, the ping
// is reset unanswered, as a grey peer's would be.
func WithHealthCheck(check func(from peer.ID) error) Option {
	return func(o *options) error {
		if check == nil {
			return errors.New("node: nil health check")
		}
		o.healthCheck = check
		return nil
	}
}

// WithAPIToken makes the local API require this bearer token. Without one
// the API may only listen on loopback: New refuses anything else.
func WithAPIToken(token string) Option {
	return func(o *options) error { o.apiToken = token; return nil }
}

// infoSource is a field WithInfo adds to GET /v1/info.
type infoSource struct {
	key  string
	view func() any
}

// WithInfo adds a field to GET /v1/info: under key, what f returns at the
// time of the request (left out when nil), so that a part of the process
// the node does not know, such as fault injection, shows its state next to
// the node's own. Fields come after the node's own, in the order added; key
// must not be one of the node's own keys or one added before.
func WithInfo(key string, f func() any) Option {
	return func(o *options) error {
		if key == "" || f == nil {
			return errors.New("node: info field needs a key and a function")
		}
		if slices.Contains(infoKeys, key) || slices.ContainsFunc(o.info, func(s infoSource) bool { return s.key == key }) {
			return fmt.Errorf("node: info field %q: the key is taken", key)
		}
		o.info = append(o.info, infoSource{key, f})
		return nil
	}
}

// WithVersion sets the version the node advertises (default "dev").
func WithVersion(v string) Option {
	return func(o *options) error {
		if v == "" || len(v) > maxNameLen {
			return fmt.Errorf("node: version %q: want 1 to %d bytes", v, maxNameLen)
		}
		o.version = v
		return nil
	}
}

// WithIdentity sets the node's key instead of the one in the data dir
// (tests use it to start many nodes without touching disk).
func WithIdentity(key crypto.PrivKey) Option {
	return func(o *options) error {
		if key == nil {
			return errors.New("node: nil identity key")
		}
		o.key = key
		return nil
	}
}

// WithAPIHandler mounts h on the local HTTP API under pattern (http.ServeMux
// syntax), next to /v1/info and /v1/peers.
func WithAPIHandler(pattern string, h http.Handler) Option {
	return func(o *options) error {
		if pattern == "" || h == nil {
			return errors.New("node: API handler needs a pattern and a handler")
		}
		o.handlers = append(o.handlers, apiHandler{pattern, h})
		return nil
	}
}

// WithHost runs the node on h instead of a host of its own, so that a test
// can put many nodes on an in-memory network (go-libp2p's mocknet) or a
// program can share a host it built. The node signs its records with h's
// key, which must be in h's peerstore (WithIdentity, when also given, must
// be that key), advertises h's addresses and ignores cfg.Listen. The
// workmesh stream limits of the node's own host are not applied: h's
// resource manager is the caller's choice.
//
// The caller keeps ownership of h: Node.Close stops everything the node
// started on it (DHT, gossip, its protocol handlers) and leaves h open; the
// caller closes h, after the node or before it (a node on a closed host
// still closes, its streams failing at once).
func WithHost(h host.Host) Option {
	return func(o *options) error {
		if h == nil {
			return errors.New("node: nil host")
		}
		o.host = h
		return nil
	}
}

// WithGossipSubOptions passes options through to gossipsub.
func WithGossipSubOptions(opts ...lpubsub.Option) Option {
	return func(o *options) error {
		o.gossipOpts = append(o.gossipOpts, opts...)
		return nil
	}
}

// WithGossipTopics names topics besides the network's that the node's
// gossipsub may join (Gossip().PubSub()): an embedder's own topics. Peers'
// subscriptions to any other topic are not tracked, and joining one fails.
func WithGossipTopics(names ...string) Option {
	return func(o *options) error {
		o.gossipTopics = append(o.gossipTopics, names...)
		return nil
	}
}
