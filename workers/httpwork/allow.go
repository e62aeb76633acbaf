package httpwork

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrDestinationRefused means a fetch would have connected to an address
// the http work type refuses (loopback, private, link-local...) and that
// http-allow does not list. Test it with errors.Is.
var ErrDestinationRefused = errors.New("destination refused")

// dial connects to addr, refusing every address the allowlist does not
// permit and, whatever it permits, the node's own ports. The check runs in
// the dialer's Control hook, on the resolved address about to be
// connected, before any packet is sent.
func (h *Handler) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("dial %s: port %q: %w", addr, portText, err)
	}
	hostAllowed := h.allow.hostAllowed(host, uint16(port))
	if err := h.services.checkName(host, uint16(port)); err != nil {
		return nil, err
	}
	d := net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("dial %s: address %q: %w", host, address, err)
			}
			if err := h.own.check(ap); err != nil {
				return err
			}
			if err := h.services.checkAddr(ap, &h.own); err != nil {
				return err
			}
			if hostAllowed {
				return nil
			}
			if err := h.allow.checkAddr(ap.Addr(), ap.Port()); err != nil {
				if _, literal := netip.ParseAddr(host); literal == nil {
					return err
				}
				return fmt.Errorf("%s resolves to %w", host, err)
			}
			return nil
		},
	}
	return d.DialContext(ctx, network, addr)
}

// checkLiteral checks a redirect's target when its host is an IP address
// (a name is checked when dialed, like every address).
func (h *Handler) checkLiteral(u *url.URL) error {
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return nil
	}
	port := urlPort(u)
	if err := h.own.check(netip.AddrPortFrom(ip, port)); err != nil {
		return err
	}
	if err := h.services.checkAddr(netip.AddrPortFrom(ip, port), &h.own); err != nil {
		return err
	}
	return h.allow.checkLiteral(u.Hostname(), port)
}

// urlPort is the port a URL connects to: its own, or its scheme's.
func urlPort(u *url.URL) uint16 {
	if p, err := strconv.ParseUint(u.Port(), 10, 16); err == nil {
		return uint16(p)
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

// ProtectOwnPorts makes ports of this machine unfetchable, whatever
// http-allow says: the node gives its API port and its listen ports, so
// that no peer can use the http work type to reach the node's own API
// (and, say, switch on its fault injection) or its libp2p endpoints. An
// address is of this machine when it is loopback, unspecified or one of
// its interfaces' addresses. Each call replaces the ports of the last;
// what names each port is shown in the refusal.
func (h *Handler) ProtectOwnPorts(ports map[uint16]string) {
	m := maps.Clone(ports)
	h.own.ports.Store(&m)
}

// ProtectServices makes the local services of the node's custom work
// types unfetchable, whatever http-allow says: addrs maps each service's
// host:port (as its URL names it) to what names it in the refusal. A
// service on an address of this machine is refused on its port at every
// address of this machine; one elsewhere at its address, or by its name.
// Each call replaces the services of the last.
func (h *Handler) ProtectServices(addrs map[string]string) {
	m := make(map[string]string, len(addrs))
	for hp, what := range addrs {
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			continue
		}
		host = strings.ToLower(strings.TrimSuffix(host, "."))
		if ip, err := netip.ParseAddr(host); err == nil {
			host = ip.Unmap().WithZone("").String()
		}
		m[net.JoinHostPort(host, port)] = what
	}
	h.services.addrs.Store(&m)
}

// services are the custom types' services (ProtectServices).
type services struct {
	addrs atomic.Pointer[map[string]string]
}

func (s *services) refused(target, what string) error {
	return fmt.Errorf("%s is %s, which the http work type never fetches, whatever http-allow lists: %w",
		target, what, ErrDestinationRefused)
}

// checkName refuses a host (as the URL names it) and port that are a
// service's.
func (s *services) checkName(host string, port uint16) error {
	m := s.addrs.Load()
	if m == nil {
		return nil
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if ip, err := netip.ParseAddr(h); err == nil {
		h = ip.Unmap().WithZone("").String()
	}
	hp := net.JoinHostPort(h, strconv.Itoa(int(port)))
	if what, ok := (*m)[hp]; ok {
		return s.refused(hp, what)
	}
	return nil
}

// checkAddr refuses the address about to be dialed when it is a
// service's, or when a service listens on this machine at its port and
// ap is an address of this machine.
func (s *services) checkAddr(ap netip.AddrPort, own *ownPorts) error {
	m := s.addrs.Load()
	if m == nil {
		return nil
	}
	ip := ap.Addr().Unmap().WithZone("")
	for hp, what := range *m {
		host, portText, _ := net.SplitHostPort(hp)
		if portText != strconv.Itoa(int(ap.Port())) {
			continue
		}
		sip, err := netip.ParseAddr(host)
		if err != nil {
			continue // a name: checked by name (checkName)
		}
		if sip == ip || own.local(sip) && own.local(ip) {
			return s.refused(netip.AddrPortFrom(ip, ap.Port()).String(), what)
		}
	}
	return nil
}

// ownPorts are the node's own ports (ProtectOwnPorts).
type ownPorts struct {
	ports atomic.Pointer[map[uint16]string]
}

// check refuses ap when its port is one of the node's own and its address
// is this machine's.
func (o *ownPorts) check(ap netip.AddrPort) error {
	m := o.ports.Load()
	if m == nil {
		return nil
	}
	what, ok := (*m)[ap.Port()]
	if !ok || !o.local(ap.Addr()) {
		return nil
	}
	return fmt.Errorf("%s is this node's own %s, which the http work type never fetches, whatever http-allow lists: %w",
		ap, what, ErrDestinationRefused)
}

// local reports whether ip is an address of this machine.
func (o *ownPorts) local(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // unknown: refuse rather than risk the node's own API
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ai, ok := netip.AddrFromSlice(n.IP); ok && ai.Unmap() == ip {
				return true
			}
		}
	}
	return false
}

// httpAllow is the parsed http-allow list.
type httpAllow struct {
	rules []allowRule
}

// allowRule is one http-allow entry: an address range, a host name or a
// "*." wildcard of a domain, each for one port or (port 0) for every port.
type allowRule struct {
	prefix netip.Prefix // valid for an address or CIDR entry
	host   string       // a host name entry
	suffix string       // ".example.com" for "*.example.com"
	port   uint16       // 0: every port
}

// parseHTTPAllow parses http-allow entries: CIDRs, addresses, host names
// and "*." wildcards of a domain, each optionally followed by ":port"
// (an IPv6 address or CIDR with a port in brackets: "[::1]:8080",
// "[fd00::/8]:443").
func parseHTTPAllow(entries []string) (httpAllow, error) {
	var a httpAllow
	for i, raw := range entries {
		r, ok := parseAllowRule(strings.ToLower(strings.TrimSpace(raw)))
		if !ok {
			return httpAllow{}, fmt.Errorf("http-allow entry %d (%q): want a CIDR, an IP address, a host name or *.domain, each with an optional :port", i+1, raw)
		}
		a.rules = append(a.rules, r)
	}
	return a, nil
}

// parseAllowRule parses one lower-cased entry.
func parseAllowRule(e string) (allowRule, bool) {
	if r, ok := parseAllowTarget(e); ok {
		return r, true
	}
	// With a port: "[v6 or v6/len]:port", or "v4, v4/len or name:port".
	var target, port string
	if strings.HasPrefix(e, "[") {
		end := strings.Index(e, "]:")
		if end < 0 {
			return allowRule{}, false
		}
		target, port = e[1:end], e[end+2:]
		if !strings.Contains(target, ":") {
			return allowRule{}, false // brackets are for IPv6 only
		}
	} else {
		i := strings.LastIndexByte(e, ':')
		if i < 0 || strings.Count(e, ":") != 1 {
			return allowRule{}, false
		}
		target, port = e[:i], e[i+1:]
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != port {
		return allowRule{}, false
	}
	r, ok := parseAllowTarget(target)
	r.port = uint16(n)
	return r, ok
}

// parseAllowTarget parses an entry without a port.
func parseAllowTarget(e string) (allowRule, bool) {
	e = strings.TrimSuffix(e, ".")
	if p, err := netip.ParsePrefix(e); err == nil {
		return allowRule{prefix: p.Masked()}, true
	}
	if ip, err := netip.ParseAddr(e); err == nil {
		ip = ip.Unmap().WithZone("")
		return allowRule{prefix: netip.PrefixFrom(ip, ip.BitLen())}, true
	}
	if strings.HasPrefix(e, "*.") && validHostName(e[2:]) {
		return allowRule{suffix: e[1:]}, true
	}
	if validHostName(e) {
		return allowRule{host: e}, true
	}
	return allowRule{}, false
}

// validHostName reports whether s is a DNS name of letters, digits, '-'
// and '.' (and '_', seen in the wild).
func validHostName(s string) bool {
	if s == "" || len(s) > 253 || strings.HasPrefix(s, ".") || strings.Contains(s, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// covers reports whether the rule applies to port.
func (r allowRule) covers(port uint16) bool { return r.port == 0 || r.port == port }

// hostAllowed reports whether host (as named in the URL) is listed by name
// for port.
func (a httpAllow) hostAllowed(host string, port uint16) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	for _, r := range a.rules {
		if !r.covers(port) {
			continue
		}
		if r.host != "" && r.host == h || r.suffix != "" && strings.HasSuffix(h, r.suffix) {
			return true
		}
	}
	return false
}

// checkAddr returns an error wrapping ErrDestinationRefused when ip is in
// a refused range and no allowed CIDR covers it on port.
func (a httpAllow) checkAddr(ip netip.Addr, port uint16) error {
	why := refusedRange(ip)
	if why == "" {
		return nil
	}
	plain := ip.Unmap().WithZone("")
	for _, r := range a.rules {
		if r.prefix.IsValid() && r.covers(port) && r.prefix.Contains(plain) {
			return nil
		}
	}
	return fmt.Errorf("%s, a %s address not in http-allow: %w", netip.AddrPortFrom(ip, port), why, ErrDestinationRefused)
}

// checkLiteral checks a URL host that is an IP address; names pass (they
// are checked when dialed) unless the name itself is allowed.
func (a httpAllow) checkLiteral(host string, port uint16) error {
	ip, err := netip.ParseAddr(host)
	if err != nil || a.hostAllowed(host, port) {
		return nil
	}
	return a.checkAddr(ip, port)
}

// specialRange is an address range the http type refuses unless allowed.
type specialRange struct {
	prefix netip.Prefix
	why    string
}

var specialRanges = func() []specialRange {
	table := []struct{ cidr, why string }{
		{"0.0.0.0/8", "unspecified (\"this network\")"},
		{"10.0.0.0/8", "private (RFC 1918)"},
		{"100.64.0.0/10", "shared (CGNAT, RFC 6598)"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link-local"},
		{"172.16.0.0/12", "private (RFC 1918)"},
		{"192.0.0.0/24", "IETF protocol assignment"},
		{"192.0.2.0/24", "documentation"},
		{"192.88.99.0/24", "6to4 relay anycast"},
		{"192.168.0.0/16", "private (RFC 1918)"},
		{"198.18.0.0/15", "benchmarking"},
		{"198.51.100.0/24", "documentation"},
		{"203.0.113.0/24", "documentation"},
		{"224.0.0.0/4", "multicast"},
		{"240.0.0.0/4", "reserved"}, // with the broadcast address
		{"::/128", "unspecified"},
		{"::1/128", "loopback"},
		{"64:ff9b:1::/48", "local-use NAT64"},
		{"100::/64", "discard-only"},
		{"2001::/32", "Teredo"},
		{"2001:db8::/32", "documentation"},
		{"fc00::/7", "unique local (ULA)"},
		{"fe80::/10", "link-local"},
		{"fec0::/10", "site-local"},
		{"ff00::/8", "multicast"},
	}
	out := make([]specialRange, len(table))
	for i, r := range table {
		out[i] = specialRange{prefix: netip.MustParsePrefix(r.cidr), why: r.why}
	}
	return out
}()

var (
	nat64Prefix  = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour    = netip.MustParsePrefix("2002::/16")
	v4Compatible = netip.MustParsePrefix("::/96")
)

// refusedRange says which special range ip is in (loopback, private,
// link-local...), or "" for an ordinary public address. IPv6 forms that
// embed an IPv4 address (mapped, NAT64, 6to4, compatible) are judged by the
// address they embed, so they cannot smuggle a private one.
func refusedRange(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid"
	}
	ip = ip.WithZone("").Unmap()
	if ip.Is6() {
		b := ip.As16()
		var embedded netip.Addr
		switch {
		case nat64Prefix.Contains(ip), v4Compatible.Contains(ip) && ip.Compare(netip.IPv6Loopback()) > 0:
			embedded = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
		case sixToFour.Contains(ip):
			embedded = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
		}
		if embedded.IsValid() {
			if why := refusedRange(embedded); why != "" {
				return why + " (embedded in " + ip.String() + ")"
			}
		}
	}
	for _, r := range specialRanges {
		if r.prefix.Contains(ip) {
			return r.why
		}
	}
	return ""
}
