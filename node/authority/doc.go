// Package authority holds the pieces of a closed workmesh network that
// stand on their own: the network authority's key, the membership
// certificates it issues (its signature over the network name, a peer ID,
// the labels it attests and an expiry) and the revocations it signs, with
// their compact, canonical encoding and their verification against a
// clock the caller passes in.
//
// It needs libp2p's crypto keys and peer IDs only: no host, no network,
// no other workmesh package, so that node (records, gossip) and the CLI
// can both use it.
package authority
