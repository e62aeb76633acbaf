package custom

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
)

// Service is a custom work type backed by a local HTTP service: the
// payload is POSTed to its URL (with the configured headers) and the
// response body is the result. 2xx is success; 429 and 503 are busy (and
// while a Retry-After it sent lasts, the worker answers busy without
// asking the service again); other 5xx and connection errors are
// retryable; any other status is a permanent failure carrying the status
// and the start of the body. The URL is the operator's own: it is not
// subject to http-allow (and the http work type never reaches it). With a
// health URL, a poller owned by Run asks it every health-interval; while
// it does not answer 2xx the type reports itself out (TypeHealth) and
// refuses its work.
type Service struct {
	common
	url       string
	addr      string
	headers   http.Header
	healthURL string
	interval  time.Duration
	client    *http.Client

	// busyUntil is the end of the last Retry-After, in Unix nanoseconds.
	busyUntil atomic.Int64
	mu        sync.Mutex
	health    error // nil while the health URL answers (or without one)
	fails     int   // health polls failed in a row
	onHealth  atomic.Pointer[func()]
}

var _ Type = (*Service)(nil)

// NewService returns the service type name declared by c.
func NewService(name string, c config.CustomTypeConfig, o Options) (*Service, error) {
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("url %q is not an http or https URL", c.URL)
	}
	s := &Service{
		common: newCommon(name, c, o),
		url:    c.URL, addr: hostPort(u), headers: http.Header{},
		healthURL: c.HealthURL, interval: c.HealthInterval,
		client: &http.Client{
			// No proxy: the service is local, and a proxy would see the
			// payload. Redirects are not followed: the service answers.
			Transport: &http.Transport{
				Proxy:               nil,
				DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
				MaxIdleConnsPerHost: idleConns(c, o),
				IdleConnTimeout:     90 * time.Second,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	for k, v := range c.Headers {
		s.headers.Set(k, v)
	}
	if s.interval <= 0 {
		s.interval = config.DefaultCustomHealthInterval
	}
	if s.healthURL != "" {
		if _, err := url.Parse(s.healthURL); err != nil {
			return nil, fmt.Errorf("health-url %q: %w", s.healthURL, err)
		}
		// Out until the first poll answers: a worker that never asked
		// does not know its service is there.
		s.health = errors.New("health-url not polled yet")
	}
	return s, nil
}

// idleConns is how many connections to the service stay open between runs:
// one for every run that can be under way at once (the type's concurrency,
// within local-concurrency) and one for the health poll, so that a steady
// load reuses them rather than closing, at each lull, those over a fixed
// idle limit and opening them again. At least 16.
func idleConns(c config.CustomTypeConfig, o Options) int {
	runs := o.LocalConcurrency
	if c.Concurrency > 0 && (runs <= 0 || c.Concurrency < runs) {
		runs = c.Concurrency
	}
	return max(16, runs+1)
}

// HostPort is the host:port an http or https URL connects to, or "" when
// raw is not one.
func HostPort(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return ""
	}
	return hostPort(u)
}

// hostPort is the host:port u connects to.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// Addr is the host:port of the service (and of its health URL's, when
// it names another, see Addrs).
func (s *Service) Addr() string { return s.addr }

// Addrs are the host:port of the service and of its health URL.
func (s *Service) Addrs() []string {
	out := []string{s.addr}
	if u, err := url.Parse(s.healthURL); err == nil && s.healthURL != "" {
		if hp := hostPort(u); hp != s.addr {
			out = append(out, hp)
		}
	}
	return out
}

// OnHealthChange sets what runs when the type's health changes (the node
// re-announces its work types).
func (s *Service) OnHealthChange(f func()) { s.onHealth.Store(&f) }

// TypeHealth returns nil while the health URL answers 2xx (always without
// a health URL), and why not otherwise.
func (s *Service) TypeHealth() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.health
}

// Run polls the health URL every health-interval until ctx ends; without
// a health URL it returns at once.
func (s *Service) Run(ctx context.Context) {
	if s.healthURL == "" {
		return
	}
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll asks the health URL once and records the answer.
func (s *Service) poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, min(s.interval, 5*time.Second))
	defer cancel()
	var err error
	req, rerr := http.NewRequestWithContext(ctx, http.MethodGet, s.healthURL, nil)
	if rerr != nil {
		err = rerr
	} else {
		resp, derr := s.client.Do(req)
		switch {
		case derr != nil:
			err = derr
		default:
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
			_ = resp.Body.Close()
			if resp.StatusCode < 200 || resp.StatusCode > 299 {
				err = fmt.Errorf("answered %s", resp.Status)
			}
		}
	}
	if ctx.Err() != nil && err != nil && context.Cause(ctx) == context.Canceled {
		return // stopping
	}
	s.mu.Lock()
	was := s.health == nil
	if err != nil {
		s.fails++
		s.health = fmt.Errorf("health-url %s failed (%d in a row): %v", s.healthURL, s.fails, err)
	} else {
		s.fails, s.health = 0, nil
	}
	now := s.health == nil
	s.mu.Unlock()
	if was != now {
		if f := s.onHealth.Load(); f != nil {
			(*f)()
		}
	}
}

// Close releases the idle connections to the service.
func (s *Service) Close() { s.client.CloseIdleConnections() }

// Do POSTs payload to the service and classifies the answer.
func (s *Service) Do(ctx context.Context, payload []byte) workers.Result {
	if err := s.TypeHealth(); err != nil {
		return workers.Fail(workers.Unsupported, "work type %s is out on this worker: %v", s.name, err)
	}
	if until := s.busyUntil.Load(); until != 0 && time.Now().UnixNano() < until {
		left := time.Until(time.Unix(0, until))
		return workers.Fail(workers.Busy, "work type %s: the service asked to wait (Retry-After), %s left", s.name, left.Round(time.Millisecond)).
			WithDetail(workers.Detail{RetryAfter: left})
	}
	if !s.acquire() {
		return s.busy()
	}
	defer s.release()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(payload))
	if err != nil {
		return workers.Fail(workers.PermanentError, "work type %s: %v", s.name, err)
	}
	for k, v := range s.headers {
		req.Header[k] = v
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return workers.Fail(workers.RetryableError, "work type %s: the service did not answer: %v", s.name, unwrapURLError(err))
	}
	defer resp.Body.Close()
	code := resp.StatusCode
	if code >= 200 && code <= 299 {
		body, err := io.ReadAll(io.LimitReader(resp.Body, int64(s.maxOutput)+1))
		if err != nil {
			return workers.Fail(workers.RetryableError, "work type %s: reading the answer: %v", s.name, unwrapURLError(err))
		}
		if len(body) > s.maxOutput {
			return workers.Fail(workers.PermanentError, "work type %s: the answer is longer than max-output %d bytes", s.name, s.maxOutput).
				WithDetail(workers.Detail{HTTPStatus: code})
		}
		return workers.OK(body)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, workers.MaxDetailText+1))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection can be reused
	d := workers.Detail{HTTPStatus: code, Body: boundedText(body)}
	switch {
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		if wait, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			d.RetryAfter = wait
			s.busyUntil.Store(time.Now().Add(wait).UnixNano())
		}
		return workers.Fail(workers.Busy, "work type %s: the service is busy (%s)", s.name, resp.Status).WithDetail(d)
	case code >= 500:
		return workers.Fail(workers.RetryableError, "work type %s: the service failed (%s)", s.name, resp.Status).WithDetail(d)
	}
	return workers.Fail(workers.PermanentError, "work type %s: the service refused the work (%s)", s.name, resp.Status).WithDetail(d)
}

// maxRetryAfter bounds the wait a service may ask for.
const maxRetryAfter = 5 * time.Minute

// retryAfter parses a Retry-After value: seconds, or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n <= 0 {
			return 0, false
		}
		return min(time.Duration(n)*time.Second, maxRetryAfter), true
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), maxRetryAfter), true
	}
	return 0, false
}

// boundedText is body as text of at most workers.MaxDetailText bytes.
func boundedText(b []byte) string {
	if len(b) > workers.MaxDetailText {
		b = b[:workers.MaxDetailText]
		for len(b) > 0 && !utf8.Valid(b) {
			b = b[:len(b)-1]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// unwrapURLError drops the method and URL net/http wraps errors in: the
// message names the type already.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
