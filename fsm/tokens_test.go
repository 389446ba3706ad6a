package fsm_test

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

func tokenCreate(text string, role pb.Role, name string, ttl time.Duration) *pb.Command {
	h := sha256.Sum256([]byte(text))
	return &pb.Command{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{
		Hash: h[:], Role: role, Name: name, TtlMs: ttl.Milliseconds()}}}
}

func tokenRevoke(id string) *pb.Command {
	return &pb.Command{Op: &pb.Command_TokenRevoke{TokenRevoke: &pb.TokenRevokeCmd{Id: id}}}
}

var tokensQuery = &pb.Query{Q: &pb.Query_Tokens{Tokens: &pb.TokensQuery{}}}

func TestTokensCreateListRevoke(t *testing.T) {
	h := ft.New(t, fsm.Config{})
	r := h.Must(tokenCreate("alice's secret", pb.Role_ROLE_WRITE, "alice", time.Hour))
	alice := r.Tokens[0]
	require.Equal(t, pb.Role_ROLE_WRITE, alice.Role)
	require.Equal(t, alice.CreatedNs+int64(time.Hour), alice.ExpiresNs, "lifetime counts from the entry's time")
	h.Must(tokenCreate("bob's secret", pb.Role_ROLE_READ, "bob", 0))

	cases := []struct {
		name string
		cmd  *pb.Command
		want syscall.Errno
	}{
		{"same token again", tokenCreate("alice's secret", pb.Role_ROLE_READ, "", 0), syscall.EEXIST},
		{"short hash", &pb.Command{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{Hash: []byte("x"), Role: pb.Role_ROLE_READ}}}, syscall.EINVAL},
		{"node role", tokenCreate("n", pb.Role_ROLE_NODE, "", 0), syscall.EINVAL},
		{"no role", tokenCreate("n", pb.Role_ROLE_NONE, "", 0), syscall.EINVAL},
		{"unknown role", tokenCreate("n", pb.Role(99), "", 0), syscall.EINVAL},
		{"negative lifetime", tokenCreate("n", pb.Role_ROLE_READ, "", -time.Second), syscall.EINVAL},
		{"long name", tokenCreate("n", pb.Role_ROLE_READ, string(make([]byte, 256)), 0), syscall.ENAMETOOLONG},
		{"revoke unknown", tokenRevoke("0123456789abcdef"), syscall.ENOENT},
		{"revoke bad id", tokenRevoke("alice"), syscall.EINVAL},
		{"revoke non-hex id", tokenRevoke("0123456789abcdeg"), syscall.EINVAL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := h.MustQ(tokensQuery)
			r := h.Do(tc.cmd)
			require.Equal(t, uint32(tc.want), r.Errno, r.Message)
			require.Equal(t, before.Tokens, h.MustQ(tokensQuery).Tokens, "a refused command changes nothing")
		})
	}

	list := h.MustQ(tokensQuery).Tokens
	require.Len(t, list, 2)
	hash := sha256.Sum256([]byte("alice's secret"))
	require.Equal(t, fsm.TokenID(hash[:]), alice.Id)
	got := h.F.Token(hash[:])
	require.NotNil(t, got)
	require.Equal(t, pb.Role_ROLE_WRITE, got.Role)
	require.Nil(t, h.F.Token(make([]byte, 32)))
	require.Nil(t, h.F.Token([]byte("short")))

	// Tokens survive a snapshot and write back the same bytes.
	snap := snapBytes(t, h.F)
	g := restored(t, snap)
	require.Equal(t, list, g.Query(tokensQuery).Tokens)
	require.Equal(t, snap, snapBytes(t, g))

	h.Must(tokenRevoke(alice.Id))
	require.Nil(t, h.F.Token(hash[:]))
	require.Len(t, h.MustQ(tokensQuery).Tokens, 1)

	if os.Getenv("MEMFS_WRITE_SEEDS") != "" {
		// The fuzz corpora's token seeds: this state's snapshot, and an
		// entry creating and revoking tokens.
		writeSeed(t, "FuzzRestore", "tokens", snap)
		writeSeed(t, "FuzzApplyBytes", "tokens", ft.Marshal(ft.Entry(ft.Start,
			tokenCreate("seed", pb.Role_ROLE_ADMIN, "seed", time.Minute), tokenRevoke(alice.Id))))
	}
}

func writeSeed(t *testing.T, fuzzer, name string, data []byte) {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n[]byte(")
	b.WriteString(strconv.Quote(string(data)))
	b.WriteString(")\n")
	require.NoError(t, os.WriteFile(filepath.Join("testdata", "fuzz", fuzzer, name), b.Bytes(), 0o644))
}
