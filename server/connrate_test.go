package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNewConnectionsPerHostRate(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLimitListener(nil, 1<<20, 1<<20, 4)
	l.now = func() time.Time { return now }
	took := func(host string, n int) int {
		got := 0
		for range n {
			if l.take(host) {
				got++
			}
		}
		return got
	}
	require.Equal(t, 4, took("10.0.0.1", 10), "a burst of the rate, then nothing")
	require.Equal(t, 4, took("10.0.0.2", 4), "another host has its own bucket")
	now = now.Add(500 * time.Millisecond)
	require.Equal(t, 2, took("10.0.0.1", 10), "half a second refills half")
	now = now.Add(time.Hour)
	require.Equal(t, 4, took("10.0.0.1", 10), "never more than the burst")

	// Hosts seen once are forgotten once their buckets are full again.
	for i := range 2000 {
		took(fmt.Sprintf("10.1.%d.%d", i/256, i%256), 1)
	}
	require.Greater(t, len(l.buckets), 2000)
	now = now.Add(2 * time.Second)
	took("10.0.0.3", 1)
	require.Len(t, l.buckets, 1, "only the host that just connected")

	// A rate of 0 bounds nothing.
	free := newLimitListener(nil, 1<<20, 1<<20, 0)
	for range 1000 {
		require.True(t, free.take("10.0.0.1"))
	}
}
