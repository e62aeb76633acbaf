package httpwork

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// Only the classification is tested for public addresses: nothing here
// dials anything but loopback.
func TestRefusedRange(t *testing.T) {
	refused := map[string]string{
		"127.0.0.1":            "loopback",
		"127.255.0.9":          "loopback",
		"::1":                  "loopback",
		"10.1.2.3":             "private",
		"172.16.0.1":           "private",
		"172.31.255.255":       "private",
		"192.168.1.1":          "private",
		"100.64.0.1":           "CGNAT",
		"100.127.255.255":      "CGNAT",
		"169.254.169.254":      "link-local",
		"fe80::1":              "link-local",
		"fe80::1%eth0":         "link-local",
		"fc00::1":              "unique local",
		"fd12:3456::1":         "unique local",
		"0.0.0.0":              "unspecified",
		"::":                   "unspecified",
		"224.0.0.1":            "multicast",
		"239.255.255.250":      "multicast",
		"ff02::1":              "multicast",
		"255.255.255.255":      "reserved",
		"::ffff:127.0.0.1":     "loopback",
		"::ffff:10.0.0.1":      "private",
		"64:ff9b::a00:1":       "RFC 1918) (embedded",
		"64:ff9b::7f00:1":      "loopback (embedded",
		"2002:a9fe:a9fe::1":    "link-local (embedded",
		"::a00:1":              "RFC 1918) (embedded",
		"198.18.0.1":           "benchmarking",
		"2001:db8::1":          "documentation",
		"2001:0:4136:e378::1":  "Teredo",
		"64:ff9b:1::a00:1":     "NAT64",
		"100::1":               "discard",
		"fec0::1":              "site-local",
		"192.0.0.8":            "IETF",
		"240.0.0.1":            "reserved",
		"0.1.2.3":              "unspecified",
		"::ffff:169.254.0.1":   "link-local",
		"::ffff:100.100.0.100": "CGNAT",
	}
	for s, want := range refused {
		got := refusedRange(netip.MustParseAddr(s))
		if !strings.Contains(got, want) {
			t.Errorf("refusedRange(%s) = %q, want it to say %q", s, got, want)
		}
	}
	public := []string{
		"8.8.8.8", "1.1.1.1", "172.32.0.1", "172.15.255.255", "100.63.255.255", "100.128.0.1",
		"192.169.0.1", "169.255.0.1", "223.255.255.255", "11.0.0.1",
		"2606:4700:4700::1111", "2a00:1450:4001::200e", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1",
	}
	for _, s := range public {
		if got := refusedRange(netip.MustParseAddr(s)); got != "" {
			t.Errorf("refusedRange(%s) = %q, want \"\" (public)", s, got)
		}
	}
}

func TestHTTPAllow(t *testing.T) {
	a, err := parseHTTPAllow([]string{"10.0.0.0/8", "192.168.1.7", "Internal.Example.", "*.corp.example", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ip string
		ok bool
	}{
		{"10.9.9.9", true}, {"192.168.1.7", true}, {"192.168.1.8", false}, {"::1", true},
		{"::ffff:10.1.1.1", true}, {"127.0.0.1", false}, {"8.8.8.8", true},
	} {
		err := a.checkAddr(netip.MustParseAddr(c.ip), 80)
		if (err == nil) != c.ok {
			t.Errorf("checkAddr(%s) = %v, want allowed %v", c.ip, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrDestinationRefused) {
			t.Errorf("checkAddr(%s) = %v, want ErrDestinationRefused", c.ip, err)
		}
	}
	for host, ok := range map[string]bool{
		"internal.example": true, "INTERNAL.example.": true, "a.corp.example": true, "x.y.corp.example": true,
		"corp.example": false, "evilcorp.example": false, "internal.example.evil": false,
	} {
		if got := a.hostAllowed(host, 443); got != ok {
			t.Errorf("hostAllowed(%s) = %v, want %v", host, got, ok)
		}
	}
	for _, bad := range []string{"", "http://x", "10.0.0.0/33", "a b", "*.", "*x.com", "a..b",
		"127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:08", "127.0.0.1:", "[127.0.0.1]:80", "::1:80x", "[::1]", "a:b:80"} {
		if _, err := parseHTTPAllow([]string{"10.0.0.0/8", bad}); err == nil || !strings.Contains(err.Error(), "entry 2") {
			t.Errorf("parseHTTPAllow(%q) = %v, want an error naming entry 2", bad, err)
		}
	}
}

// TestHTTPAllowPorts: an entry with a port allows that port only; one
// without allows every port.
func TestHTTPAllowPorts(t *testing.T) {
	a, err := parseHTTPAllow([]string{"127.0.0.1:8080", "10.0.0.0/8:443", "[::1]:9000", "[fd00::/8]:53", "api.internal:8443", "*.corp.example:80", "192.168.1.7"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ip   string
		port uint16
		ok   bool
	}{
		{"127.0.0.1", 8080, true}, {"127.0.0.1", 8081, false}, {"127.0.0.1", 7400, false},
		{"10.1.2.3", 443, true}, {"10.1.2.3", 80, false},
		{"::1", 9000, true}, {"::1", 9001, false},
		{"fd00::5", 53, true}, {"fd00::5", 54, false},
		{"192.168.1.7", 1, true}, {"192.168.1.7", 65535, true},
	} {
		if err := a.checkAddr(netip.MustParseAddr(c.ip), c.port); (err == nil) != c.ok {
			t.Errorf("checkAddr(%s, %d) = %v, want allowed %v", c.ip, c.port, err, c.ok)
		}
	}
	for _, c := range []struct {
		host string
		port uint16
		ok   bool
	}{
		{"api.internal", 8443, true}, {"api.internal", 443, false}, {"x.corp.example", 80, true}, {"x.corp.example", 8080, false},
	} {
		if got := a.hostAllowed(c.host, c.port); got != c.ok {
			t.Errorf("hostAllowed(%s, %d) = %v, want %v", c.host, c.port, got, c.ok)
		}
	}
}
