package jsonrpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/workmesh/workmesh/workers/httpwork"
)

// The upstream's HTTP side: one bounded POST, on a transport of the relay's
// own, with the URL kept out of what is shown.

// errResponseTooLarge marks an upstream response over the bound.
var errResponseTooLarge = errors.New("upstream response too large")

// postHeader is the header of every upstream request. Requests share it:
// neither the client nor its transport writes to a request's header (a
// redirect or credentials in the URL make a copy first; a cookie jar
// does write, so a client with one gets a copy).
var postHeader = http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json"}}

// post sends body to the upstream and reads the answer, bounded.
func (j *Relay) post(ctx context.Context, body []byte) (int, []byte, error) {
	resp, err := j.send(ctx, body)
	if err != nil {
		return 0, nil, fmt.Errorf("upstream %s: %w", j.shown, httpwork.UnwrapURLError(err))
	}
	defer resp.Body.Close()
	data, more, err := readAtMost(resp, j.opts.maxResponse)
	if err != nil {
		return 0, nil, fmt.Errorf("upstream %s: read the response: %w", j.shown, err)
	}
	if more {
		return 0, nil, fmt.Errorf("upstream %s: response larger than %d bytes: %w", j.shown, j.opts.maxResponse, errResponseTooLarge)
	}
	return resp.StatusCode, data, nil
}

// request is a POST of body to the upstream: a copy of the relay's
// request template (made once, in New: method, URL, header) with ctx and
// the body, rather than a new request parsed from strings each time.
func (j *Relay) request(ctx context.Context, body []byte) *http.Request {
	req := j.template.WithContext(ctx)
	// Each request has its own copy of the URL, as the client may rewrite
	// a request's URL.
	u := *j.url
	req.URL = &u
	req.ContentLength = int64(len(body))
	req.Body = io.NopCloser(bytes.NewReader(body))
	// The transport sends the body again on a kept-alive connection the
	// upstream closed before it read the request.
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) == 0 {
		req.Body, req.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
	}
	if j.client.Jar != nil { // a client of WithClient's adds its cookies to the header
		req.Header = postHeader.Clone()
	}
	return req
}

// send posts body to the upstream. With a plain client (see
// directTransport) the request goes to its transport at once: Client.Do
// would copy the request's header for redirects it might follow and wrap
// its cancellation, a tenth of the relay's allocations for nothing on an
// upstream that does not redirect. An answer that redirects is sent again
// through Client.Do, which follows it as it always has (the upstream sees
// the first request twice, its redirect not being an answer).
func (j *Relay) send(ctx context.Context, body []byte) (*http.Response, error) {
	req := j.request(ctx, body)
	if j.direct == nil {
		return j.client.Do(req)
	}
	resp, err := j.direct.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if !redirects(resp) {
		return resp, nil
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // so the connection is kept
	resp.Body.Close()
	return j.client.Do(j.request(ctx, body))
}

// directTransport returns c's transport when a request to u may skip
// Client.Do: a net/http Transport, and nothing Client.Do adds (a cookie
// jar, a timeout of the client's own, basic auth from credentials in u);
// redirects are left to send. Otherwise nil.
func directTransport(c *http.Client, u *url.URL) *http.Transport {
	rt := c.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	t, ok := rt.(*http.Transport)
	if !ok || c.Jar != nil || c.Timeout != 0 || u.User != nil {
		return nil
	}
	return t
}

// redirects reports whether Client.Do would follow resp to another URL.
func redirects(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return resp.Header.Get("Location") != ""
	}
	return false
}

// readAtMost reads resp's body, up to n bytes; more reports a body longer
// than n. A body of known length is read into one buffer of that size
// (up to n), not grown step by step.
func readAtMost(resp *http.Response, n int) (data []byte, more bool, err error) {
	if resp.ContentLength < 0 || resp.ContentLength > int64(n) {
		return httpwork.ReadAtMost(resp.Body, n)
	}
	// One byte over: a body longer than announced is read to the bound
	// and found too large, as one of unknown length is.
	buf := bytes.NewBuffer(make([]byte, 0, int(resp.ContentLength)+bytes.MinRead))
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, int64(n)+1)); err != nil {
		return nil, false, err
	}
	if buf.Len() > n {
		return buf.Bytes()[:n], true, nil
	}
	return buf.Bytes(), false, nil
}

// redactURL returns a URL reduced to its scheme and host, or a placeholder
// when it cannot be parsed: upstream URLs often carry API keys in the path.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "(unparseable URL)"
	}
	return u.Scheme + "://" + u.Host
}
