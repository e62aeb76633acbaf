package stack

import (
	"fmt"

	"github.com/workmesh/workmesh/config"
	"github.com/workmesh/workmesh/node"
	"github.com/workmesh/workmesh/node/authority"
)

// membershipOptions returns the node option of a closed network (none for
// an open one): the authority of network-authority and the certificate in
// membership-cert, which the settings checked when they were loaded. The
// labels are those that count for the local worker: in a closed network
// the certificate's only, otherwise the node's own.
func membershipOptions(cfg config.Config) ([]node.Option, []string, error) {
	m := cfg.Membership
	if m.NetworkAuthority == "" {
		return nil, cfg.Node.Labels, nil
	}
	auth, err := authority.ParsePublicKey(m.NetworkAuthority)
	if err != nil {
		return nil, nil, usageError(fmt.Errorf("network-authority: %w", err))
	}
	var cert *authority.Certificate
	if m.MembershipCert != "" {
		b, err := authority.ReadFile(m.MembershipCert)
		if err != nil {
			return nil, nil, usageError(fmt.Errorf("membership-cert: %w", err))
		}
		if cert, err = authority.DecodeCertificate(b); err != nil {
			return nil, nil, usageError(fmt.Errorf("membership-cert %q: %w", m.MembershipCert, err))
		}
	}
	var labels []string
	if cert != nil {
		labels = cert.Labels()
	}
	return []node.Option{node.WithMembership(auth, cert)}, labels, nil
}
