package server

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConfigRefusesAProcessLimitTooSmallForTheNode(t *testing.T) {
	c := Config{ID: "a", Ephemeral: true, ProcessMemoryLimit: MinProcessMemoryLimit - 1}
	require.ErrorContains(t, c.check(), "needs for itself")
	c.ProcessMemoryLimit = MinProcessMemoryLimit
	if err := c.check(); err != nil {
		require.NotContains(t, err.Error(), "needs for itself")
	}
}
