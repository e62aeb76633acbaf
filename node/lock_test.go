package node

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/workmesh/workmesh/config"
)

func TestDataDirLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	l, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, LockFile))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q (%v), want this pid %d", b, err, os.Getpid())
	}
	// flock locks belong to the open file, so a second open in this
	// process is refused as another process's would be.
	_, err = lockDataDir(dir)
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second lock: %v, want ErrDataDirInUse", err)
	}
	if want := "data dir " + dir + " in use by pid " + strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Fatalf("second lock: %q, want it to say %q", err, want)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	l.Close()
}

func TestNodeHoldsDataDirLock(t *testing.T) {
	cfg := config.Defaults().Node
	cfg.Listen = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.API = ""
	cfg.DataDir = t.TempDir()
	n, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(t.Context(), cfg); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second node on the data dir: %v, want ErrDataDirInUse", err)
	}
	n.Close()
	n, err = New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("node after the first closed: %v", err)
	}
	n.Close()
}
