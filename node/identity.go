package node

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// IdentityFile is the name of the node's private key inside its data dir.
const IdentityFile = "identity.key"

// DataDir returns dir, or $HOME/.workmesh when dir is empty.
func DataDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("data dir: no --data-dir given and no home directory: %w", err)
	}
	return filepath.Join(home, ".workmesh"), nil
}

// LoadOrCreateIdentity returns the node key kept in <dir>/identity.key,
// creating an Ed25519 key there (mode 0600, in a 0700 directory) on first use.
// An existing key is reused as it is, so the peer ID survives restarts.
func LoadOrCreateIdentity(dir string) (crypto.PrivKey, error) {
	path := filepath.Join(dir, IdentityFile)
	b, err := os.ReadFile(path)
	if err == nil {
		key, err := crypto.UnmarshalPrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("identity %s: %w", path, err)
		}
		return key, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("identity %s: %w", path, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("identity: data dir %s: %w", dir, err)
	}
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generate key: %w", err)
	}
	b, err = crypto.MarshalPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("identity: encode key: %w", err)
	}
	// O_EXCL: when two processes race on a fresh data dir, one wins and the
	// other reads the winner's key instead of overwriting it.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return LoadOrCreateIdentity(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("identity %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("identity %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("identity %s: %w", path, err)
	}
	return key, nil
}
