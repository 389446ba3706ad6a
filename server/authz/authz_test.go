package authz_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/authz"
)

// TestTablesNameEverything fails when a method, command or query is added
// without a line in the tables: it would need the node role, which no
// client has, so it must be placed on purpose.
func TestTablesNameEverything(t *testing.T) {
	svc := pb.File_memfs_proto.Services().ByName("MemFS")
	require.NotNil(t, svc)
	for i := range svc.Methods().Len() {
		m := svc.Methods().Get(i)
		full := "/" + string(svc.FullName()) + "/" + string(m.Name())
		_, ok := authz.Methods[full]
		require.True(t, ok, "method %s has no role in authz.Methods", full)
	}
	require.Len(t, authz.Methods, svc.Methods().Len(), "authz.Methods names a method the service lacks")

	ops := (&pb.Command{}).ProtoReflect().Descriptor().Oneofs().ByName("op").Fields()
	for i := range ops.Len() {
		_, ok := authz.Commands[ops.Get(i).Name()]
		require.True(t, ok, "command %s has no role in authz.Commands", ops.Get(i).Name())
	}
	require.Len(t, authz.Commands, ops.Len())
	qs := (&pb.Query{}).ProtoReflect().Descriptor().Oneofs().ByName("q").Fields()
	for i := range qs.Len() {
		_, ok := authz.Queries[qs.Get(i).Name()]
		require.True(t, ok, "query %s has no role in authz.Queries", qs.Get(i).Name())
	}
	require.Len(t, authz.Queries, qs.Len())
}

func TestCommandRoles(t *testing.T) {
	open := func(flags uint32, excl bool) *pb.Command {
		return &pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{Flags: flags, Exclusive: excl}}}
	}
	write := &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{}}}
	closeCmd := &pb.Command{Op: &pb.Command_Close{Close: &pb.CloseCmd{}}}
	cases := []struct {
		name string
		cmd  *pb.Command
		want pb.Role
	}{
		{"read-only open", open(0, false), pb.Role_ROLE_READ},
		{"open for writing", open(1, false), pb.Role_ROLE_WRITE},
		{"open read-write", open(2, false), pb.Role_ROLE_WRITE},
		{"read-only open that creates", open(0x40, false), pb.Role_ROLE_WRITE},
		{"read-only open that truncates", open(0x200, false), pb.Role_ROLE_WRITE},
		{"exclusive read-only open", open(0, true), pb.Role_ROLE_WRITE},
		{"shared capabilities", &pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{}}}, pb.Role_ROLE_READ},
		{"exclusive capabilities", &pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Exclusive: true}}}, pb.Role_ROLE_WRITE},
		{"batch of closes", &pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{Commands: []*pb.Command{closeCmd}}}}, pb.Role_ROLE_WRITE},
		{"batch hiding a token", &pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{Commands: []*pb.Command{write,
			{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{}}}}}}}, pb.Role_ROLE_ADMIN},
		{"shared lock", &pb.Command{Op: &pb.Command_Lock{Lock: &pb.LockCmd{Type: pb.LockType_LOCK_READ}}}, pb.Role_ROLE_READ},
		{"unlock", &pb.Command{Op: &pb.Command_Lock{Lock: &pb.LockCmd{Type: pb.LockType_LOCK_UNLOCK}}}, pb.Role_ROLE_READ},
		{"exclusive lock", &pb.Command{Op: &pb.Command_Lock{Lock: &pb.LockCmd{Type: pb.LockType_LOCK_WRITE}}}, pb.Role_ROLE_WRITE},
		{"tick", &pb.Command{Op: &pb.Command_Tick{Tick: &pb.TickCmd{}}}, pb.Role_ROLE_NODE},
		{"no operation", &pb.Command{}, pb.Role_ROLE_READ},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, authz.Command(tc.cmd))
		})
	}
	require.Equal(t, pb.Role_ROLE_NODE, authz.Method("/memfs.v1.MemFS/NotYetWritten"))
	require.Equal(t, pb.Role_ROLE_ADMIN, authz.Query(&pb.Query{Q: &pb.Query_Tokens{Tokens: &pb.TokensQuery{}}}))
}

func TestParseRole(t *testing.T) {
	for _, s := range []string{"read", "write", "admin", "node"} {
		r, err := authz.ParseRole(s)
		require.NoError(t, err)
		require.Equal(t, s, authz.RoleName(r))
	}
	_, err := authz.ParseRole("root")
	require.Error(t, err)
}
