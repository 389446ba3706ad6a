package faultnet

import (
	"fmt"
	"math/rand/v2"
)

// LoopbackIP returns a random address in 127.0.0.0/8 (all loopback on
// Linux) for one cluster to bind its nodes on. A crashed node's ports are
// free until it restarts on them; if every cluster bound 127.0.0.1, another
// cluster in this or another test process could be given such a port in
// the meantime, and this cluster's clients would then talk to the wrong
// cluster. On an address of its own, a cluster's ports cannot be taken.
func LoopbackIP() string {
	v := rand.Uint32N(1 << 24)
	return fmt.Sprintf("127.%d.%d.%d", 1+(v>>16)%254, (v>>8)&0xff, 1+(v&0xff)%254)
}
