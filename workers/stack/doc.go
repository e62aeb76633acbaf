// Package stack assembles a workmesh node from its parts: the node (host,
// records, gossip, API), the local worker and its registry, the work
// protocol server, the dispatcher and the work API. It also keeps the
// work types a node advertises in step with their health (TypeHealth):
// a type whose local service or upstream is out is withdrawn alone,
// while the node's other types go on serving.
package stack
