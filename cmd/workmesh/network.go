package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/spf13/cobra"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/authority"
)

// Bounds of `network admit --expires`.
const (
	defaultCertLifetime = 720 * time.Hour
	maxCertLifetime     = 10 * 365 * 24 * time.Hour
	// expiryWarning is how close to its expiry a node's certificate makes
	// the settings warn.
	expiryWarning = 24 * time.Hour
)

func newNetworkCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Run a closed network: its authority key, membership certificates and revocations",
		Long: "network makes the key of a network authority and, with it, the membership certificates that\n" +
			"admit a node (its peer ID, the labels the authority vouches for, an expiry) and the revocations\n" +
			"that take a node out. A node names the authority with --network-authority and its certificate\n" +
			"with --membership-cert; `workmesh config validate` checks both. A node with an authority takes\n" +
			"records, work and protocol streams only from members (README, \"Membership\").",
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newNetworkInitCommand(), newNetworkAdmitCommand(), newNetworkRevokeCommand(), newNetworkInspectCommand(),
		newNetworkPublishCommand())
	return cmd
}

func newNetworkInitCommand() *cobra.Command {
	var out string
	var force bool
	cmd := &cobra.Command{
		Use:   "init --out FILE",
		Short: "Make a network authority key and print its public key",
		Long: "init makes a new network authority key, writes it to --out with mode 0600 and prints its public\n" +
			"key as one line on stdout: the value of every member's network-authority setting. It refuses to\n" +
			"replace an existing file unless --force is given (certificates of the old key would then count\n" +
			"for nothing). Keep the key file off the nodes: only `network admit` and `network revoke` need it.",
		Example: "  workmesh network init --out authority.key",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usageError{errors.New("network init: --out FILE is required")}
			}
			a, err := authority.Generate()
			if err != nil {
				return err
			}
			if err := a.Save(out, force); err != nil {
				return usageError{err}
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), a.Public())
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to write the authority's private key to (mode 0600)")
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing key file")
	cmd.MarkFlagFilename("out")
	return cmd
}

// newNodeIDCommand is `workmesh node id`, which root.go adds under node.
func newNodeIDCommand() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "id [--data-dir DIR]",
		Short: "Print the node's peer ID, making its identity first if the data dir has none",
		Long: "id prints the peer ID of the node that keeps its identity in --data-dir (default $HOME/.workmesh),\n" +
			"making the identity there first if there is none, as `node start` would: an operator can admit a\n" +
			"node with `workmesh network admit --peer` before its first start.",
		Example: "  workmesh network admit --key authority.key --peer $(workmesh node id --data-dir /var/lib/workmesh) --out node.cert",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := node.DataDir(dataDir)
			if err != nil {
				return usageError{err}
			}
			key, err := node.LoadOrCreateIdentity(dir)
			if err != nil {
				return usageError{err}
			}
			id, err := peer.IDFromPrivateKey(key)
			if err != nil {
				return fmt.Errorf("identity in %s: %w", dir, err)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), id)
			return err
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory that keeps the node identity (empty: $HOME/.workmesh)")
	cmd.MarkFlagDirname("data-dir")
	return cmd
}

// statementFlags are the flags admit and revoke share.
type statementFlags struct {
	key, peer, network, out string
}

func (f *statementFlags) bind(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&f.key, "key", "", "the authority key file, from `workmesh network init`")
	cmd.Flags().StringVar(&f.peer, "peer", "", "peer ID of the node (`workmesh node id` prints it)")
	cmd.Flags().StringVar(&f.network, "network", config.Defaults().Node.Network, "network name, as the node's network setting")
	cmd.Flags().StringVar(&f.out, "out", "", "file to write the "+what+" to")
	cmd.MarkFlagFilename("key")
	cmd.MarkFlagFilename("out")
}

// load checks the shared flags and reads the key; every problem is a
// usage error naming the flag.
func (f *statementFlags) load(name string) (*authority.Authority, peer.ID, error) {
	var missing []string
	for _, m := range []struct{ flag, v string }{{"--key FILE", f.key}, {"--peer PEERID", f.peer}, {"--out FILE", f.out}} {
		if m.v == "" {
			missing = append(missing, m.flag)
		}
	}
	if len(missing) > 0 {
		return nil, "", usageError{fmt.Errorf("network %s: missing %s", name, strings.Join(missing, " and "))}
	}
	id, err := peer.Decode(f.peer)
	if err != nil {
		return nil, "", usageError{fmt.Errorf("network %s: --peer %q is not a peer ID: %v", name, f.peer, err)}
	}
	a, err := authority.Load(f.key)
	if err != nil {
		return nil, "", usageError{fmt.Errorf("network %s: --key: %w", name, err)}
	}
	return a, id, nil
}

func writeStatement(path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return usageError{fmt.Errorf("--out: %w", err)}
	}
	return nil
}

func newNetworkAdmitCommand() *cobra.Command {
	var f statementFlags
	var labels []string
	var expires time.Duration
	cmd := &cobra.Command{
		Use:   "admit --key FILE --peer PEERID [--labels a,b] [--expires 720h] [--network NAME] --out CERT",
		Short: "Issue a membership certificate for a node",
		Long: "admit signs, with the authority key, a membership certificate that makes the peer a member of the\n" +
			"network until --expires from now, and attests --labels for it (labels a certificate does not carry\n" +
			"count for nothing in a closed network). The node names the file with membership-cert.",
		Example: "  workmesh network admit --key authority.key --peer 12D3KooW... --labels staked,archive --expires 720h --out node.cert",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, id, err := f.load("admit")
			if err != nil {
				return err
			}
			if expires <= 0 || expires > maxCertLifetime {
				return usageError{fmt.Errorf("network admit: --expires %s: want more than 0 and at most %s (10 years)", expires, maxCertLifetime)}
			}
			now := time.Now()
			c, err := a.Admit(f.network, id, labels, now, now.Add(expires))
			if err != nil {
				return usageError{fmt.Errorf("network %w", err)}
			}
			if err := writeStatement(f.out, c.Encode()); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "admitted %s to network %s, labels %s, until %s: %s\n",
				c.Peer(), c.Network(), dash(strings.Join(c.Labels(), ",")), c.Expires().Format(time.RFC3339), f.out)
			return err
		},
	}
	f.bind(cmd, "certificate")
	cmd.Flags().StringSliceVar(&labels, "labels", nil, "labels the authority attests for the node (comma-separated)")
	cmd.Flags().DurationVar(&expires, "expires", defaultCertLifetime, "how long from now the certificate counts")
	return cmd
}

func newNetworkRevokeCommand() *cobra.Command {
	var f statementFlags
	cmd := &cobra.Command{
		Use:   "revoke --key FILE --peer PEERID [--network NAME] --out FILE",
		Short: "Sign a revocation that takes a node out of the network",
		Long: "revoke signs, with the authority key, a revocation of the peer: its certificates issued until now\n" +
			"stop counting (a certificate issued later admits it again). Any member publishes it (all drop\n" +
			"the peer at once) with `workmesh network publish-revocation FILE --api ADDR`.",
		Example: "  workmesh network revoke --key authority.key --peer 12D3KooW... --out node.revocation",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, id, err := f.load("revoke")
			if err != nil {
				return err
			}
			r, err := a.Revoke(f.network, id, time.Now())
			if err != nil {
				return usageError{fmt.Errorf("network %w", err)}
			}
			if err := writeStatement(f.out, r.Encode()); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "revoked %s in network %s at %s: %s\n",
				r.Peer(), r.Network(), r.IssuedAt().Format(time.RFC3339), f.out)
			return err
		},
	}
	f.bind(cmd, "revocation")
	return cmd
}

// statementView is what `network inspect --output json|yaml` prints.
type statementView struct {
	// Kind is "membership-certificate" or "revocation".
	Kind      string     `json:"kind"`
	Network   string     `json:"network"`
	Peer      string     `json:"peer"`
	Labels    []string   `json:"labels,omitempty"`
	Issued    time.Time  `json:"issued"`
	Expires   *time.Time `json:"expires,omitempty"`
	Expired   bool       `json:"expired,omitempty"`
	Authority string     `json:"authority"`
	// Signature is "ok": inspect fails on any other.
	Signature string `json:"signature"`
	// Checked says what the statement was checked against beyond its own
	// signature (--network-authority, --network, --peer).
	Checked []string `json:"checked,omitempty"`
}

func newNetworkInspectCommand() *cobra.Command {
	var output, auth, network, peerFlag string
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Print a membership certificate or a revocation, and check its signature",
		Long: "inspect reads a certificate or a revocation, checks that its signature verifies under the authority\n" +
			"it names and prints what it says. With --network-authority, --network or --peer it also checks it is\n" +
			"for them. A file that is malformed, changed after signing or not for what was asked exits 2 with the\n" +
			"reason; an expired certificate is printed as expired (exit 0).",
		Example: "  workmesh network inspect node.cert\n  workmesh network inspect node.cert --network-authority $(cat authority.pub) --network prod -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(&output); err != nil {
				return err
			}
			want := authority.Expect{Network: network}
			if auth != "" {
				k, err := authority.ParsePublicKey(auth)
				if err != nil {
					return usageError{fmt.Errorf("--network-authority: %w", err)}
				}
				want.Authority = k
			}
			if peerFlag != "" {
				id, err := peer.Decode(peerFlag)
				if err != nil {
					return usageError{fmt.Errorf("--peer %q is not a peer ID: %v", peerFlag, err)}
				}
				want.Peer = id
			}
			v, err := inspectFile(args[0], want, time.Now())
			if err != nil {
				return usageError{err}
			}
			if output != outputText {
				return writeData(cmd.OutOrStdout(), output, v)
			}
			printStatement(cmd.OutOrStdout(), v, time.Now())
			return nil
		},
	}
	addOutputFlag(cmd, &output, outputText)
	cmd.Flags().StringVar(&auth, "network-authority", "", "also check it is signed by this authority (its public key line)")
	cmd.Flags().StringVar(&network, "network", "", "also check it is for this network")
	cmd.Flags().StringVar(&peerFlag, "peer", "", "also check it is for this peer ID")
	return cmd
}

// inspectFile reads the statement in path and checks its signature, and
// what want sets of it (an unset field is not checked).
func inspectFile(path string, want authority.Expect, now time.Time) (statementView, error) {
	b, err := readStatement(path)
	if err != nil {
		return statementView{}, err
	}
	var v statementView
	if authority.IsRevocation(b) {
		r, err := authority.DecodeRevocation(b)
		if err != nil {
			return v, fmt.Errorf("%s: %w", path, err)
		}
		if err := r.VerifySignature(); err != nil {
			return v, fmt.Errorf("%s: %w", path, err)
		}
		v = statementView{Kind: "revocation", Network: r.Network(), Peer: r.Peer().String(), Issued: r.IssuedAt(),
			Authority: r.Authority().String(), Signature: "ok"}
		if err := checkStatement(&v, want, func(w authority.Expect) error { return r.Verify(w) }); err != nil {
			return v, fmt.Errorf("%s: %w", path, err)
		}
		return v, nil
	}
	c, err := authority.DecodeCertificate(b)
	if err != nil {
		return v, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.VerifySignature(); err != nil {
		return v, fmt.Errorf("%s: %w", path, err)
	}
	exp := c.Expires()
	v = statementView{Kind: "membership-certificate", Network: c.Network(), Peer: c.Peer().String(), Labels: c.Labels(),
		Issued: c.IssuedAt(), Expires: &exp, Expired: !now.Before(exp), Authority: c.Authority().String(), Signature: "ok"}
	// Expiry is shown, not refused: inspecting an old certificate is
	// what one does to see why it stopped counting.
	err = checkStatement(&v, want, func(w authority.Expect) error {
		if err := c.Verify(w, exp.Add(-time.Second)); err != nil && !errors.Is(err, authority.ErrExpired) {
			return err
		}
		return nil
	})
	if err != nil {
		return v, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// checkStatement runs verify against want, filling in what want does not
// set from the statement itself so that only what was asked is checked,
// and records what was.
func checkStatement(v *statementView, want authority.Expect, verify func(authority.Expect) error) error {
	w := want
	if w.Authority.IsZero() {
		w.Authority, _ = authority.ParsePublicKey(v.Authority)
	} else {
		v.Checked = append(v.Checked, "authority")
	}
	if w.Network == "" {
		w.Network = v.Network
	} else {
		v.Checked = append(v.Checked, "network")
	}
	if w.Peer != "" {
		v.Checked = append(v.Checked, "peer")
	}
	return verify(w)
}

// readStatement reads a certificate or revocation file, bounded.
func readStatement(path string) ([]byte, error) { return authority.ReadFile(path) }

func printStatement(w io.Writer, v statementView, now time.Time) {
	if v.Kind == "revocation" {
		fmt.Fprintln(w, "revocation")
	} else {
		fmt.Fprintln(w, "membership certificate")
	}
	fmt.Fprintf(w, "network:    %s\n", v.Network)
	fmt.Fprintf(w, "peer:       %s\n", v.Peer)
	if v.Kind != "revocation" {
		fmt.Fprintf(w, "labels:     %s\n", dash(strings.Join(v.Labels, ",")))
	}
	fmt.Fprintf(w, "issued:     %s\n", v.Issued.Format(time.RFC3339))
	if v.Expires != nil {
		if v.Expired {
			fmt.Fprintf(w, "expires:    %s (expired %s ago)\n", v.Expires.Format(time.RFC3339), now.Sub(*v.Expires).Round(time.Second))
		} else {
			fmt.Fprintf(w, "expires:    %s (in %s)\n", v.Expires.Format(time.RFC3339), v.Expires.Sub(now).Round(time.Second))
		}
	}
	fmt.Fprintf(w, "authority:  %s\n", v.Authority)
	sig := "ok (verifies under the authority above)"
	if len(v.Checked) > 0 {
		sig += "; matches the given " + strings.Join(v.Checked, ", ")
	}
	fmt.Fprintf(w, "signature:  %s\n", sig)
}

// checkMembership is the settings' LoadOptions.Membership: the authority
// line parses, and the node's certificate reads, verifies against that
// authority and the network, is for the node's own peer ID when its data
// dir has an identity, and does not expire within a day (a warning).
// Every check of one command is as of the same instant (checkedAt), so a
// command that loads its settings twice (config validate) words the
// expiry warning alike both times and prints it once.
func checkMembership(c *config.Config) []config.Finding {
	return membershipFindings(c, checkedAt())
}

// checkedAt is when this process first checked a membership certificate.
var checkedAt = sync.OnceValue(time.Now)

func membershipFindings(c *config.Config, now time.Time) []config.Finding {
	m := c.Membership
	if m.NetworkAuthority == "" {
		return nil
	}
	auth, err := authority.ParsePublicKey(m.NetworkAuthority)
	if err != nil {
		return []config.Finding{{Key: "network-authority", Msg: "network-authority: " + err.Error()}}
	}
	if m.MembershipCert == "" {
		return []config.Finding{{Key: "network-authority", Warning: true,
			Msg: "network-authority is set but membership-cert is not: this node has no certificate, so the network's members refuse its records and work"}}
	}
	fail := func(format string, args ...any) []config.Finding {
		return []config.Finding{{Key: "membership-cert", Msg: fmt.Sprintf("membership-cert %q: ", m.MembershipCert) + fmt.Sprintf(format, args...)}}
	}
	b, err := readStatement(m.MembershipCert)
	if err != nil {
		return fail("%v", err)
	}
	cert, err := authority.DecodeCertificate(b)
	if err != nil {
		return fail("%v", err)
	}
	want := authority.Expect{Authority: auth, Network: c.Node.Network}
	id, err := identityPeer(c.Node.DataDir)
	if err != nil {
		return []config.Finding{{Key: "data-dir", Msg: err.Error()}}
	}
	want.Peer = id
	if err := cert.Verify(want, now); err != nil {
		return fail("%v", err)
	}
	if left := cert.Expires().Sub(now); left < expiryWarning {
		return []config.Finding{{Key: "membership-cert", Warning: true, Msg: fmt.Sprintf(
			"membership-cert %q expires in %s (at %s): issue a new one with `workmesh network admit`",
			m.MembershipCert, left.Round(time.Second), cert.Expires().Format(time.RFC3339))}}
	}
	return nil
}

// identityPeer is the peer ID of the identity in the node's data dir, ""
// when it has none yet (a certificate may be issued before the first
// start). It never makes an identity.
func identityPeer(dataDir string) (peer.ID, error) {
	dir, err := node.DataDir(dataDir)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, node.IdentityFile)); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	key, err := node.LoadOrCreateIdentity(dir)
	if err != nil {
		return "", err
	}
	return peer.IDFromPrivateKey(key)
}

// warned holds the warnings already printed, per command: a command that
// loads its settings twice (config validate) prints each once.
var warned sync.Map

type warning struct {
	cmd *cobra.Command
	msg string
}

// warnTo returns the settings' Warn for cmd: "warning: ..." on its
// stderr.
func warnTo(cmd *cobra.Command) func(string) {
	return func(msg string) {
		if _, dup := warned.LoadOrStore(warning{cmd, msg}, true); !dup {
			fmt.Fprintln(cmd.ErrOrStderr(), "warning: "+msg)
		}
	}
}
