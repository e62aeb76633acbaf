package authority

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// publicKeyPrefix is the multibase code of base64url without padding, the
// encoding of a PublicKey's printable line.
const publicKeyPrefix = "u"

// maxKeyBytes bounds a marshalled key, public or private, read from a file
// or a setting.
const maxKeyBytes = 1024

// Authority is a network authority: the private key whose signatures make a
// peer a member of the network, or take that away.
type Authority struct {
	priv crypto.PrivKey
	pub  PublicKey
}

// Generate makes a new authority with an Ed25519 key.
func Generate() (*Authority, error) {
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("authority: generate key: %w", err)
	}
	return fromPrivate(priv), nil
}

func fromPrivate(priv crypto.PrivKey) *Authority {
	return &Authority{priv: priv, pub: PublicKey{key: priv.GetPublic()}}
}

// Public returns the authority's public key, which every member is
// configured with (network-authority).
func (a *Authority) Public() PublicKey { return a.pub }

// Save writes the authority's private key to path with mode 0600. It
// refuses to replace an existing file unless force is set, so that a
// second `network init` cannot lose the key a network depends on.
func (a *Authority) Save(path string, force bool) error {
	b, err := crypto.MarshalPrivateKey(a.priv)
	if err != nil {
		return fmt.Errorf("authority key %s: encode: %w", path, err)
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("authority key %s: the file exists; refusing to overwrite it (pass --force to replace it, which makes every certificate of the old key useless)", path)
	}
	if err != nil {
		return fmt.Errorf("authority key %s: %w", path, err)
	}
	// An existing file replaced with force keeps its mode; a key must not
	// stay readable by others.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("authority key %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("authority key %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("authority key %s: %w", path, err)
	}
	return nil
}

// Load reads an authority key written by Save. It refuses a file that
// others than its owner may read or write, as ssh does with its keys.
func Load(path string) (*Authority, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("authority key %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("authority key %s: %w", path, err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("authority key %s: mode %04o lets others read or write it; want 0600 (chmod 600 %s)", path, perm, path)
	}
	if st.Size() > maxKeyBytes {
		return nil, fmt.Errorf("authority key %s: %d bytes, not a key (at most %d)", path, st.Size(), maxKeyBytes)
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && st.Size() > 0 {
		return nil, fmt.Errorf("authority key %s: %w", path, err)
	}
	priv, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("authority key %s: not a private key written by `workmesh network init`: %w", path, err)
	}
	return fromPrivate(priv), nil
}

// PublicKey is an authority's public key. Its zero value is no key.
type PublicKey struct {
	key crypto.PubKey
}

// ParsePublicKey parses the one line String prints (surrounding space is
// ignored).
func ParsePublicKey(s string) (PublicKey, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return PublicKey{}, errors.New("authority public key is empty")
	}
	if !strings.HasPrefix(s, publicKeyPrefix) {
		return PublicKey{}, fmt.Errorf("authority public key %q: want the line `workmesh network init` printed, starting with %q", short(s), publicKeyPrefix)
	}
	b, err := base64.RawURLEncoding.DecodeString(s[len(publicKeyPrefix):])
	if err != nil {
		return PublicKey{}, fmt.Errorf("authority public key %q: not base64url: %w", short(s), err)
	}
	return unmarshalPublicKey(b)
}

func unmarshalPublicKey(b []byte) (PublicKey, error) {
	if len(b) > maxKeyBytes {
		return PublicKey{}, fmt.Errorf("authority public key: %d bytes, at most %d", len(b), maxKeyBytes)
	}
	k, err := crypto.UnmarshalPublicKey(b)
	if err != nil {
		return PublicKey{}, fmt.Errorf("authority public key: %w", err)
	}
	return PublicKey{key: k}, nil
}

// String returns the key as one printable line: "u" (multibase base64url)
// followed by the libp2p-marshalled public key.
func (k PublicKey) String() string {
	b := k.bytes()
	if b == nil {
		return ""
	}
	return publicKeyPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// IsZero reports whether k holds no key.
func (k PublicKey) IsZero() bool { return k.key == nil }

// Equal reports whether k and o are the same key.
func (k PublicKey) Equal(o PublicKey) bool {
	if k.key == nil || o.key == nil {
		return k.key == nil && o.key == nil
	}
	return k.key.Equals(o.key)
}

func (k PublicKey) bytes() []byte {
	if k.key == nil {
		return nil
	}
	b, err := crypto.MarshalPublicKey(k.key)
	if err != nil {
		return nil
	}
	return b
}

// short cuts s for an error message.
func short(s string) string {
	if len(s) > 24 {
		return s[:24] + "..."
	}
	return s
}
