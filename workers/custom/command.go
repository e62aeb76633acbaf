package custom

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/workers"
)

// Command is a custom work type backed by a program: the payload is its
// standard input, its standard output the result. It runs without a
// shell, with the arguments of the configuration as a list, in a clean
// environment holding only what env lists, in a process group of its own
// that is killed (with everything the program forked) when the request's
// deadline passes, the request is cancelled or the output grows past its
// bound, so that no process outlives its request.
type Command struct {
	common
	path      string
	argv      []string
	env       []string
	dir       string
	retryable int
	// lookAt is where the program is looked for (path, from dir when
	// relative): TypeHealth checks it is still there.
	lookAt   string
	onHealth atomic.Pointer[func()]
}

var _ Type = (*Command)(nil)

// stderrKeep is how much of a command's standard error is kept while it
// runs (its end); the result carries its last lines, at most
// workers.MaxDetailText bytes.
const stderrKeep = 16 << 10

// stderrLines is how many of the last lines of stderr a result carries.
const stderrLines = 20

// pipeWait bounds how long a finished run waits for its output pipes to
// close when a process that left the group still holds them.
const pipeWait = time.Second

// NewCommand returns the command type name declared by c. The program is
// looked up now, in the node's PATH, so that a missing one stops the
// start.
func NewCommand(name string, c config.CustomTypeConfig, o Options) (*Command, error) {
	if len(c.Command) == 0 || c.Command[0] == "" {
		return nil, errors.New("the command is empty")
	}
	path := c.Command[0]
	at := path
	if !strings.Contains(path, "/") {
		p, err := exec.LookPath(path)
		if err != nil {
			return nil, fmt.Errorf("command %q: %w", path, err)
		}
		path, at = p, p
	} else {
		// A path is checked as a name is: a program that is not there,
		// or not executable, stops the start rather than failing every
		// run of a type the node advertises. A relative one runs from
		// dir.
		if !filepath.IsAbs(at) && c.Dir != "" {
			at = filepath.Join(c.Dir, at)
		}
		if _, err := exec.LookPath(at); err != nil {
			return nil, fmt.Errorf("command %q: %w", path, err)
		}
	}
	if err := prepareReaping(); err != nil {
		return nil, err
	}
	env := make([]string, 0, len(c.Env))
	for k, v := range c.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	cmd := &Command{
		common: newCommon(name, c, o),
		path:   path, argv: append([]string(nil), c.Command...), env: env, dir: c.Dir,
		retryable: c.RetryableExitCode, lookAt: at,
	}
	if cmd.retryable == 0 {
		cmd.retryable = config.DefaultRetryableExitCode
	}
	return cmd, nil
}

// Addr is "": a command has no service address.
func (c *Command) Addr() string { return "" }

// TypeHealth is nil while the program is there and executable, and its
// working directory too: one removed after the start takes the type out
// on this worker (withdrawn from its record), not the work with it.
func (c *Command) TypeHealth() error {
	if _, err := exec.LookPath(c.lookAt); err != nil {
		return fmt.Errorf("program %s: %w", c.argv[0], err)
	}
	if c.dir != "" {
		if fi, err := os.Stat(c.dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("dir %s is not a directory any more", c.dir)
		}
	}
	return nil
}

// OnHealthChange sets what runs when a run finds the type out (the node
// re-announces its work types).
func (c *Command) OnHealthChange(f func()) { c.onHealth.Store(&f) }

// Run has nothing to do for a command.
func (c *Command) Run(context.Context) {}

// Close has nothing to release: every run cleans up after itself.
func (c *Command) Close() {}

// Do runs the program once with payload on its standard input.
func (c *Command) Do(ctx context.Context, payload []byte) workers.Result {
	if !c.acquire() {
		return c.busy()
	}
	defer c.release()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	r, err := runProcess(ctx, c.path, c.argv, c.env, c.dir, payload, c.maxOutput)
	if err != nil {
		// The program could not start: a fault of this worker, not of
		// the work, which another worker may run.
		if herr := c.TypeHealth(); herr != nil {
			if f := c.onHealth.Load(); f != nil {
				(*f)()
			}
			return workers.Fail(workers.Unsupported, "work type %s is out on this worker: %v", c.name, herr)
		}
		return workers.Fail(workers.RetryableError, "work type %s: start %s: %v", c.name, c.argv[0], err)
	}
	tail := lastLines(r.stderr, stderrLines, workers.MaxDetailText)
	switch {
	case r.overflow:
		return workers.Fail(workers.PermanentError, "work type %s: output is longer than max-output %d bytes; the run was stopped", c.name, c.maxOutput).
			WithDetail(workers.Detail{Stderr: tail})
	case r.killed != nil:
		why := "the request was cancelled"
		if errors.Is(r.killed, context.DeadlineExceeded) {
			why = fmt.Sprintf("its deadline passed (timeout %s, or the request's deadline if sooner)", c.timeout)
		} else if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			why = cause.Error() // the node stopping, say, rather than the client
		}
		return workers.Fail(workers.RetryableError, "work type %s: %s killed after %s: %s", c.name, c.argv[0], r.took.Round(time.Millisecond), why).
			WithDetail(workers.Detail{Stderr: tail})
	case r.signal != "":
		return workers.Fail(workers.PermanentError, "work type %s: %s was killed by signal %s", c.name, c.argv[0], r.signal).
			WithDetail(workers.Detail{Stderr: tail})
	case r.code == 0:
		return workers.OK(r.stdout)
	case r.code == c.retryable:
		return workers.Fail(workers.RetryableError, "work type %s: %s exited with code %d (retryable)%s", c.name, c.argv[0], r.code, lastLineOf(tail)).
			WithDetail(workers.Detail{ExitCode: r.code, HasExitCode: true, Stderr: tail})
	}
	return workers.Fail(workers.PermanentError, "work type %s: %s exited with code %d%s", c.name, c.argv[0], r.code, lastLineOf(tail)).
		WithDetail(workers.Detail{ExitCode: r.code, HasExitCode: true, Stderr: tail})
}

// runResult is how one run of a program ended.
type runResult struct {
	stdout   []byte
	stderr   []byte
	code     int    // exit code, when it exited
	signal   string // the signal that killed it, when one did that the node did not send
	killed   error  // why the node killed it: ctx's error
	overflow bool   // killed because its output passed the bound
	took     time.Duration
}

// boundedBuffer keeps what is written up to max bytes and reports once
// when more arrives.
type boundedBuffer struct {
	buf  bytes.Buffer
	max  int
	over chan struct{}
}

func (b *boundedBuffer) readFrom(f *os.File) {
	chunk := make([]byte, 32<<10)
	for {
		n, err := f.Read(chunk)
		if n > 0 {
			if b.buf.Len()+n > b.max {
				close(b.over)
				return
			}
			b.buf.Write(chunk[:n])
		}
		if err != nil {
			return
		}
	}
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	buf []byte
	max int
}

func (t *tailBuffer) readFrom(f *os.File) {
	chunk := make([]byte, 4<<10)
	for {
		n, err := f.Read(chunk)
		if n > 0 {
			t.buf = append(t.buf, chunk[:n]...)
			if len(t.buf) > t.max {
				t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
			}
		}
		if err != nil {
			return
		}
	}
}

// lastLines returns the last n lines of b, at most max bytes, as text.
func lastLines(b []byte, n, max int) string {
	s := strings.TrimRight(strings.ToValidUTF8(string(b), "\uFFFD"), "\n")
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	s = strings.Join(lines, "\n")
	if len(s) > max {
		cut := len(s) - max
		for cut < len(s) && s[cut]&0xC0 == 0x80 {
			cut++
		}
		s = s[cut:]
	}
	return s
}

// lastLineOf is ": " and the last line of stderr, for an error message,
// or "" when there is none.
func lastLineOf(tail string) string {
	if tail == "" {
		return ""
	}
	if i := strings.LastIndexByte(tail, '\n'); i >= 0 {
		tail = tail[i+1:]
	}
	return ": " + workers.Truncate(tail, 200)
}
