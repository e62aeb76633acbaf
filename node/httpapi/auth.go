package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"
)

// The local API takes work and changes settings: whoever reaches it uses
// the node. On loopback that is the machine's own users; anywhere else it
// must ask for a bearer token.

// MinTokenLen is the shortest api-token accepted, in bytes: a token that
// guards an API reachable from other machines must not be guessable.
const MinTokenLen = 16

// A token must also be random-looking, not only long: "aaaaaaaaaaaaaaaa"
// is 16 bytes and no secret. Its characters' empirical entropy (bits per
// character times its length) and the number of different characters are
// the measure: a random hex token of 16 characters has about 50 bits and
// 10 different ones, a random one of 24 or more well above.
const (
	minTokenDistinct = 8
	minTokenBits     = 40
)

// tokenStrength returns the number of different characters of token and
// its empirical entropy in bits.
func tokenStrength(token string) (distinct int, bits float64) {
	counts := map[rune]int{}
	for _, r := range token {
		counts[r]++
	}
	n := float64(len(token))
	for _, c := range counts {
		p := float64(c) / n
		bits -= p * math.Log2(p)
	}
	return len(counts), bits * n
}

// ErrExposed means the local API would listen on an address other than
// loopback without an api-token.
var ErrExposed = errors.New("api exposed without a token")

// CheckExposure refuses an API address that is not loopback when token
// is empty (the node must not start), and a token that is set but too short
// or not sendable in an Authorization header. An empty addr (no API) is
// fine. Loopback is 127.0.0.0/8, ::1 and the name "localhost"; any other
// name or address, including an empty host (":7400", every interface),
// needs a token. Names are not resolved.
func CheckExposure(addr, token string) error {
	if token != "" {
		if len(token) < MinTokenLen {
			return fmt.Errorf("api-token: %d bytes, want at least %d", len(token), MinTokenLen)
		}
		if i := strings.IndexFunc(token, func(r rune) bool { return r > unicode.MaxASCII || !unicode.IsGraphic(r) || unicode.IsSpace(r) }); i >= 0 {
			return fmt.Errorf("api-token: byte %d is a space, a control or a non-ASCII character; want printable ASCII", i+1)
		}
		if distinct, bits := tokenStrength(token); distinct < minTokenDistinct || bits < minTokenBits {
			return fmt.Errorf("api-token: too easy to guess (%d different characters, about %.0f bits; want at least %d and %d): use a random one, e.g. openssl rand -hex 24",
				distinct, bits, minTokenDistinct, minTokenBits)
		}
	}
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("api address %q: %w", addr, err)
	}
	if isLoopbackHost(host) || token != "" {
		return nil
	}
	where := host
	if where == "" {
		where = "every interface"
	}
	return fmt.Errorf("api address %s listens on %s, not loopback: set api-token (a bearer token of at least %d bytes) or listen on 127.0.0.1: %w",
		addr, where, MinTokenLen, ErrExposed)
}

// isLoopbackHost reports whether host (from an address, without port) can
// only be reached from this machine.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// RequireToken lets through only requests that carry "Authorization:
// Bearer <token>"; others get 401 with a JSON error and a WWW-Authenticate
// header. The comparison takes the same time whatever the token sent. An
// empty token requires nothing and returns next as it is: an API without a
// token is one CheckExposure kept on loopback. Refusals are slowed down
// (failedTokenRate a second, after a burst, for all clients together) and
// logged to log, at most once per failedTokenLogEvery with their count,
// so that guessing is slow and seen; a nil log logs nothing.
func RequireToken(token string, log logrus.FieldLogger, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := sha256.Sum256([]byte(token))
	failed := newRefusals(log)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearer(r.Header.Get("Authorization"))
		// Hashing both sides makes the comparison constant-time in the
		// token's length as well as its contents.
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			msg := "missing bearer token: send Authorization: Bearer <api-token>"
			if ok {
				msg = "invalid bearer token"
			}
			failed.wait(r)
			w.Header().Set("WWW-Authenticate", `Bearer realm="workmesh"`)
			WriteError(w, http.StatusUnauthorized, "", "%s", msg)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// How refused tokens are slowed down and logged.
const (
	failedTokenRate     = 10 // refusals a second, for all clients together
	failedTokenBurst    = 20
	failedTokenLogEvery = 10 * time.Second
)

// refusals slows down and logs the requests RequireToken refuses.
type refusals struct {
	limit *rate.Limiter
	log   logrus.FieldLogger
	mu    sync.Mutex
	n     int       // refused since the last log line
	last  time.Time // when the last log line was written
}

func newRefusals(log logrus.FieldLogger) *refusals {
	return &refusals{limit: rate.NewLimiter(failedTokenRate, failedTokenBurst), log: log}
}

// wait counts a refusal of r, logs it when a line is due, and holds the
// answer until the refusal rate allows it (or r's client goes away).
func (f *refusals) wait(r *http.Request) {
	if f.log != nil {
		f.mu.Lock()
		f.n++
		if now := time.Now(); now.Sub(f.last) >= failedTokenLogEvery {
			f.log.WithFields(logrus.Fields{"remote": r.RemoteAddr, "path": r.URL.Path, "refused": f.n}).
				Warn("api: refused requests without the right token (slowed down)")
			f.n, f.last = 0, now
		}
		f.mu.Unlock()
	}
	_ = f.limit.Wait(r.Context())
}

// bearer returns the token of an Authorization header of the Bearer scheme
// (the scheme's name is case-insensitive).
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// LimitBody bounds the body of every request to n bytes: a request that
// declares a longer body is answered 413 with a JSON error before next
// runs, and a body that turns out longer fails next's read of it (an
// *http.MaxBytesError). n must be positive.
func LimitBody(n int64, next http.Handler) http.Handler {
	if n < 1 {
		panic(fmt.Sprintf("httpapi: LimitBody(%d): want a positive limit", n))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > n {
			WriteError(w, http.StatusRequestEntityTooLarge, "", "body: %d bytes, more than the %d allowed", r.ContentLength, n)
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = http.MaxBytesReader(w, r.Body, n)
		}
		next.ServeHTTP(w, r)
	})
}
