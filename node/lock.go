package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// LockFile is the name of the lock file inside the data dir. A running node
// holds an flock(2) on it and keeps its pid in it; the lock dies with the
// process, so a file left behind by a killed node never blocks the next one.
const LockFile = "lock"

// ErrDataDirInUse is wrapped by the error of a node that found its data dir
// locked by another running process.
var ErrDataDirInUse = errors.New("data dir in use")

// dirInUseError says which process holds the data dir.
type dirInUseError struct{ dir, holder string }

func (e *dirInUseError) Error() string {
	return fmt.Sprintf("data dir %s in use by %s; stop it or give this node another --data-dir", e.dir, e.holder)
}

func (e *dirInUseError) Is(target error) bool { return target == ErrDataDirInUse }

// dirLock is the lock a node holds on its data dir while it runs.
type dirLock struct {
	f *os.File
}

// lockDataDir takes the data dir's lock, creating the dir (0700) when
// needed, and writes this process's pid into the lock file. When another
// process holds the lock, the error wraps ErrDataDirInUse and names the dir
// and that process's pid.
func lockDataDir(dir string) (*dirLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &dirInUseError{dir: dir, holder: lockHolder(path)}
		}
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	pid := strconv.Itoa(os.Getpid()) + "\n"
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(pid), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	return &dirLock{f: f}, nil
}

// lockHolder reads the pid of the process that holds the lock at path, as
// "pid N". The holder writes it just after taking the lock, so an empty
// file is read again for a moment before giving up on it.
func lockHolder(path string) string {
	for range 20 {
		b, err := os.ReadFile(path)
		if err != nil {
			break
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			return "pid " + strconv.Itoa(pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "another process"
}

// Close releases the lock. The file stays: the next node takes the lock on
// it and writes its own pid.
func (l *dirLock) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	if err != nil {
		return fmt.Errorf("data dir lock: %w", err)
	}
	return nil
}
