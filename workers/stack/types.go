package stack

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	ma "github.com/multiformats/go-multiaddr"
	"github.com/sirupsen/logrus"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/workers"
	"github.com/workmesh/workmesh/workers/builtin"
	"github.com/workmesh/workmesh/workers/custom"
	"github.com/workmesh/workmesh/workers/httpwork"
	"github.com/workmesh/workmesh/workers/jsonrpc"
)

// extraTypes holds the work types that need settings of their own: http
// (served when work-types lists it) and jsonrpc (served when
// jsonrpc-upstream is set). The stack owns them and their head poller.
type extraTypes struct {
	http    *httpwork.Handler
	jsonrpc *jsonrpc.Relay
	// custom holds the operator's own types (custom-types), by name.
	custom map[string]custom.Type
	// own holds the handlers a Go program added (WithHandler), by name.
	own map[string]workers.Handler
	// services are the host:port of every declared custom type's url and
	// health-url, served here or not, for the http type to refuse.
	services map[string]string
	// announce is called when the jsonrpc head moves, so peers see the new
	// head without waiting for the next announce-interval.
	announce atomic.Pointer[func()]
}

// KnownTypes are the traits of every work type this binary has, served
// here or not: the dispatcher hedges only what a type declares idempotent.
func KnownTypes() workers.Catalog {
	c := builtin.Catalog()
	c[httpwork.Type] = httpwork.Traits
	c[jsonrpc.Type] = jsonrpc.Traits
	return c
}

// BuiltinTypes returns the work types of list that are built in: not
// http or jsonrpc, and not one of the operator's own (declared).
func BuiltinTypes(list []string, declared map[string]config.CustomTypeConfig) []string {
	out := make([]string, 0, len(list))
	for _, t := range list {
		if _, own := declared[t]; !own && t != httpwork.Type && t != jsonrpc.Type {
			out = append(out, t)
		}
	}
	return out
}

// newExtraTypes builds the http and jsonrpc work types the configuration
// asks for. A jsonrpc upstream that cannot be reached, or that reports
// another chain than jsonrpc-chain-id, stops the start.
func newExtraTypes(ctx context.Context, cfg config.Config, log *logrus.Logger) (*extraTypes, error) {
	e := &extraTypes{services: map[string]string{}}
	for name, c := range cfg.CustomTypes {
		for _, raw := range []string{c.URL, c.HealthURL} {
			if hp := custom.HostPort(raw); hp != "" {
				e.services[hp] = "the service of custom work type " + name
			}
		}
	}
	// The custom types served are those work-types lists; the others are
	// declared only (a gateway knows their traits).
	served := map[string]config.CustomTypeConfig{}
	for name, c := range cfg.CustomTypes {
		if slices.Contains(cfg.Node.WorkTypes, name) {
			served[name] = c
		}
	}
	if len(served) > 0 {
		ct, err := custom.New(served, custom.Options{MaxOutput: cfg.Limits.MaxResult, LocalConcurrency: cfg.Worker.LocalConcurrency})
		if err != nil {
			return nil, usageError(err)
		}
		e.custom = ct
	}
	if slices.Contains(cfg.Node.WorkTypes, httpwork.Type) {
		h, err := httpwork.New(cfg.HTTP, httpwork.WithMaxResult(cfg.Limits.MaxResult), httpwork.WithConcurrency(cfg.Worker.LocalConcurrency),
			httpwork.WithMaxOutput(workers.WireLimit(cfg.Limits.MaxPayload, cfg.Limits.MaxResult)))
		if err != nil {
			e.close()
			return nil, usageError(fmt.Errorf("work type http: %w", err))
		}
		e.http = h
	}
	switch {
	case cfg.JSONRPC.Upstream != "":
		j, err := jsonrpc.New(ctx, cfg.JSONRPC, log, jsonrpc.WithMaxResponse(cfg.Limits.MaxResult), jsonrpc.WithConcurrency(cfg.Worker.LocalConcurrency), jsonrpc.WithHeadChange(func(uint64) {
			if f := e.announce.Load(); f != nil {
				(*f)()
			}
		}))
		if err != nil {
			e.close()
			return nil, fmt.Errorf("work type jsonrpc: %w", err)
		}
		e.jsonrpc = j
	case slices.Contains(cfg.Node.WorkTypes, jsonrpc.Type):
		e.close()
		return nil, usageError(fmt.Errorf("work type jsonrpc needs --jsonrpc-upstream"))
	}
	return e, nil
}

// protectOwnPorts keeps the http work type away from n's own API port and
// listen ports, whatever http-allow lists. It runs once n listens (a port
// of 0 is known only then) and before any work can arrive.
func (e *extraTypes) protectOwnPorts(n *node.Node) {
	if e.http == nil {
		return
	}
	ports := make(map[uint16]string)
	for _, a := range n.Host().Network().ListenAddresses() {
		for _, code := range []int{ma.P_UDP, ma.P_TCP} {
			if v, err := a.ValueForProtocol(code); err == nil {
				if p, err := strconv.ParseUint(v, 10, 16); err == nil {
					ports[uint16(p)] = "listen port"
				}
			}
		}
	}
	if _, v, err := net.SplitHostPort(n.APIAddr()); err == nil {
		if p, err := strconv.ParseUint(v, 10, 16); err == nil {
			ports[uint16(p)] = "API port"
		}
	}
	e.http.ProtectOwnPorts(ports)
	e.http.ProtectServices(e.services)
}

// newRegistry returns a registry of the built-in types work-types lists
// (all of them when it lists none at all) and the extra types e holds.
func (e *extraTypes) newRegistry(list []string, declared map[string]config.CustomTypeConfig) (*workers.Registry, error) {
	var builtins []string
	for _, t := range BuiltinTypes(list, declared) {
		if _, own := e.own[t]; !own {
			builtins = append(builtins, t)
		}
	}
	var reg *workers.Registry
	if len(list) > 0 && len(builtins) == 0 {
		reg = workers.NewRegistry() // only extra types
	} else {
		var err error
		if reg, err = builtin.NewRegistry(builtins...); err != nil {
			return nil, err
		}
	}
	if err := e.register(reg); err != nil {
		return nil, err
	}
	return reg, nil
}

// register adds the extra types to reg.
func (e *extraTypes) register(reg *workers.Registry) error {
	if e.http != nil {
		if err := reg.Register(httpwork.Type, e.http); err != nil {
			return err
		}
	}
	if e.jsonrpc != nil {
		if err := reg.Register(jsonrpc.Type, e.jsonrpc); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(e.custom)) {
		if err := reg.Register(name, e.custom[name]); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(e.own)) {
		if err := reg.Register(name, e.own[name]); err != nil {
			return err
		}
	}
	return nil
}

// catalog is KnownTypes, the traits of the custom types cfg declares
// (served here or not: they are hedged only when idempotent) and those of
// the handlers a Go program added.
func (e *extraTypes) catalog(cfg config.Config) workers.Catalog {
	c := KnownTypes()
	for name, t := range cfg.CustomTypes {
		c[name] = custom.TraitsOf(t)
	}
	for name, h := range e.own {
		c[name] = workers.TraitsOf(h)
	}
	return c
}

// onTypeHealth sets what runs when a custom type's health changes.
func (e *extraTypes) onTypeHealth(f func()) {
	for _, t := range e.custom {
		if hc, ok := t.(interface{ OnHealthChange(func()) }); ok {
			hc.OnHealthChange(f)
		}
	}
}

// onHead sets what runs when the jsonrpc head moves.
func (e *extraTypes) onHead(f func()) { e.announce.Store(&f) }

// run polls the jsonrpc upstream's head and the custom types' health
// URLs until ctx ends.
func (e *extraTypes) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, t := range e.custom {
		wg.Go(func() { t.Run(ctx) })
	}
	if e.jsonrpc != nil {
		_ = e.jsonrpc.Run(ctx)
	}
	wg.Wait()
}

// close releases what the extra types hold.
func (e *extraTypes) close() {
	if e == nil {
		return
	}
	if e.http != nil {
		e.http.Close()
	}
	if e.jsonrpc != nil {
		e.jsonrpc.Close()
	}
	for _, t := range e.custom {
		t.Close()
	}
}
