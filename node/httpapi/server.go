package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// shutdownTimeout bounds how long Close waits for requests in progress.
const shutdownTimeout = 2 * time.Second

// Server is the one HTTP server of a process. Packages mount their routes
// on it with Handle; every request passes, in this order, panic recovery
// (a panic is a JSON 500), the response's time limit once it begins
// (ResponseTimeout), the guard against web pages and non-JSON
// bodies (Guard), the body's time limit (BodyTimeout), the token check
// (RequireToken) and the mux,
// whose answers to an unknown path (404) and to a wrong method (405, with
// its Allow header) are JSON errors like every other.
type Server struct {
	log         *logrus.Logger
	mux         *http.ServeMux
	handler     http.Handler
	bodyTimeout time.Duration
	// responseTimeout bounds the writing of a response (ResponseTimeout).
	responseTimeout time.Duration

	srv  *http.Server
	ln   net.Listener
	wg   sync.WaitGroup
	once sync.Once
	err  error
}

// Option adjusts a Server.
type Option func(*Server)

// WithBodyTimeout sets how long a client may take to send a request body
// (default DefaultBodyTimeout).
func WithBodyTimeout(d time.Duration) Option {
	return func(s *Server) { s.bodyTimeout = d }
}

// WithResponseTimeout sets how long a client may take to read a response
// once it begins (default DefaultResponseTimeout).
func WithResponseTimeout(d time.Duration) Option {
	return func(s *Server) { s.responseTimeout = d }
}

// New returns a server that requires token (none when empty; see
// CheckExposure) and logs panics, serve errors and refused tokens to log.
// It does not listen until Start.
func New(token string, log *logrus.Logger, opts ...Option) *Server {
	s := &Server{log: log, mux: http.NewServeMux(), bodyTimeout: DefaultBodyTimeout, responseTimeout: DefaultResponseTimeout}
	for _, o := range opts {
		o(s)
	}
	s.handler = Recover(log, ResponseTimeout(s.responseTimeout, Guard(token, BodyTimeout(s.bodyTimeout, RequireToken(token, log, http.HandlerFunc(s.route))))))
	return s
}

// Handle mounts h under pattern (http.ServeMux syntax, e.g. "POST
// /v1/work"). It may be called at any time, before or after Start; a
// pattern that is malformed or conflicts with one already mounted is an
// error.
func (s *Server) Handle(pattern string, h http.Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("api: mount %q: %v", pattern, r)
		}
	}()
	s.mux.Handle(pattern, h)
	return nil
}

// ServeHTTP serves a request as the listening server does: recovery, token
// check, then the mounted routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handler.ServeHTTP(w, r)
}

// route passes r to the mux. A request no pattern matches is answered by
// the mux itself (not found, method not allowed, or a redirect to the
// clean path); its error answers are rewritten into the JSON shape.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.mux.Handler(r); pattern == "" {
		w = &unmatchedWriter{ResponseWriter: w, r: r}
	}
	s.mux.ServeHTTP(w, r)
}

// unmatchedWriter turns the mux's plain-text 404 and 405 into JSON errors,
// keeping the headers the mux set (Allow, on a 405). Other answers (the
// mux's redirects) pass through.
type unmatchedWriter struct {
	http.ResponseWriter
	r        *http.Request
	replaced bool
}

func (w *unmatchedWriter) WriteHeader(code int) {
	switch code {
	case http.StatusNotFound:
		w.replaced = true
		WriteError(w.ResponseWriter, code, "", "no such path: %s", w.r.URL.Path)
	case http.StatusMethodNotAllowed:
		w.replaced = true
		WriteError(w.ResponseWriter, code, "", "%s %s: method not allowed, want %s", w.r.Method, w.r.URL.Path, w.Header().Get("Allow"))
	default:
		w.ResponseWriter.WriteHeader(code)
	}
}

// Write drops the mux's plain-text body of an answer that was replaced.
func (w *unmatchedWriter) Write(b []byte) (int, error) {
	if w.replaced {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Start listens on addr (host:port; port 0 picks one) and serves in the
// background until Close. Start is called at most once.
func (s *Server) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("api listen %s: %w", addr, err)
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       time.Minute,
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Errorf("api: %v", err)
		}
	}()
	return nil
}

// Addr returns the address the server listens on, or "" before Start.
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Close stops listening and waits up to two seconds for requests in
// progress. It is safe to call more than once, and on a server that was
// never started.
func (s *Server) Close() error {
	s.once.Do(func() {
		if s.srv == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.err = fmt.Errorf("api: %w", err)
		}
		s.wg.Wait()
	})
	return s.err
}

// Recover turns a panic in next into a JSON 500 instead of a dropped
// connection, and logs it. http.ErrAbortHandler, the standard way to abort
// an answer, is passed on.
func Recover(log *logrus.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.Errorf("api: %s %s: panic: %v", r.Method, r.URL.Path, v)
				WriteError(w, http.StatusInternalServerError, "", "internal error")
			}
		}()
		next.ServeHTTP(w, r)
	})
}
