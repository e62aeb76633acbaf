//go:build linux

package custom

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// prepareReaping makes this process the child subreaper of what it
// starts: a process a command forked whose parent died is handed to the
// node (not to PID 1, which may never reap it), so that the node reaps
// the whole process group of a run and no zombie is left behind.
var prepareReaping = sync.OnceValue(func() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become the child subreaper of commands: %w", err)
	}
	return nil
})

// runProcess runs path with argv in a process group of its own, payload on
// its stdin, and returns once every process of the group has ended and
// been reaped. The group is killed when ctx ends or the output passes
// maxOut, and also when the program exits, so that what it left running
// in the background does not survive it.
func runProcess(ctx context.Context, path string, argv, env []string, dir string, payload []byte, maxOut int) (runResult, error) {
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	inR, inW, err := pipe()
	if err != nil {
		return runResult{}, err
	}
	outR, outW, err := pipe()
	if err != nil {
		closeAll()
		return runResult{}, err
	}
	errR, errW, err := pipe()
	if err != nil {
		closeAll()
		return runResult{}, err
	}
	defer closeAll()
	cmd := &exec.Cmd{
		Path: path, Args: argv, Env: env, Dir: dir,
		Stdin: inR, Stdout: outW, Stderr: errW,
		// Pdeathsig: a node that dies (SIGKILL, a crash) takes the
		// program with it.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	}
	if cmd.Env == nil {
		cmd.Env = []string{} // nil would mean the node's environment
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return runResult{}, err
	}
	defer func() { _ = cmd.Process.Release() }()
	pid := cmd.Process.Pid
	// The child holds its ends now; the node keeps only its own.
	_, _, _ = inR.Close(), outW.Close(), errW.Close()

	var wg sync.WaitGroup
	out := &boundedBuffer{max: maxOut, over: make(chan struct{})}
	tail := &tailBuffer{max: stderrKeep}
	wg.Go(func() {
		_, _ = inW.Write(payload) // a program that does not read its input ends it with EPIPE
		_ = inW.Close()
	})
	readers := make(chan struct{})
	var rg sync.WaitGroup
	rg.Go(func() { out.readFrom(outR) })
	rg.Go(func() { tail.readFrom(errR) })
	go func() { rg.Wait(); close(readers) }()
	exited := make(chan struct{})
	wg.Go(func() {
		defer close(exited)
		var info unix.Siginfo
		for {
			// WNOWAIT: the program stays a zombie, so its process group
			// ID cannot be reused before the group is killed.
			err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	})

	var r runResult
	select {
	case <-exited:
	case <-ctx.Done():
		r.killed = ctx.Err()
	case <-out.over:
		r.overflow = true
	}
	// Whatever ended the run, nothing of its group outlives it.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-exited
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	reapGroup(pid)
	r.took = time.Since(start)
	// A process that left the group may still hold the pipes: do not
	// wait for it past pipeWait.
	t := time.NewTimer(pipeWait)
	select {
	case <-readers:
	case <-t.C:
		_, _ = outR.Close(), errR.Close()
		<-readers
	}
	t.Stop()
	_ = inW.Close()
	wg.Wait()
	r.stdout, r.stderr = out.buf.Bytes(), tail.buf
	if r.killed == nil && !r.overflow {
		switch {
		case ws.Exited():
			r.code = ws.ExitStatus()
		case ws.Signaled():
			r.signal = ws.Signal().String()
		}
	}
	return r, nil
}

// reapGroup reaps every process of group pgid that is the node's child:
// those the program forked, handed to the node when their parent died.
func reapGroup(pgid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PGID, pgid, &info, unix.WEXITED, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return // ECHILD: none left
		}
	}
}
