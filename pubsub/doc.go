// Package pubsub carries signed NodeData announcements over gossipsub: publishing, validating before delivery, and handing verified records to the peer table.
package pubsub
