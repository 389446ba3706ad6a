package authz_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/authz"
)

// FuzzRoles decodes arbitrary bytes as a command and as a query, as a node
// does with a request, and asks the role each needs: never a panic, always
// a role a caller can hold or the node role, and a batch needs at least
// what each command in it needs (so a batch cannot smuggle one past).
func FuzzRoles(f *testing.F) {
	seeds := []proto.Message{
		&pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{Flags: 0}}},
		&pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{Commands: []*pb.Command{
			{Op: &pb.Command_Close{Close: &pb.CloseCmd{}}},
			{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{Role: pb.Role_ROLE_ADMIN}}}}}}},
		&pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Exclusive: true}}},
		&pb.Query{Q: &pb.Query_Tokens{Tokens: &pb.TokensQuery{}}},
	}
	for _, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xd2, 0x01, 0x00}) // field 26 (batch), empty
	f.Fuzz(func(t *testing.T, data []byte) {
		var c pb.Command
		if proto.Unmarshal(data, &c) == nil {
			r := authz.Command(&c)
			if r < pb.Role_ROLE_READ || r > pb.Role_ROLE_NODE {
				t.Fatalf("role %v", r)
			}
			for _, nc := range c.GetBatch().GetCommands() {
				if inner := authz.Command(nc); inner > r {
					t.Fatalf("batch needs %v, a command in it %v", r, inner)
				}
			}
		}
		var q pb.Query
		if proto.Unmarshal(data, &q) == nil {
			if r := authz.Query(&q); r < pb.Role_ROLE_READ || r > pb.Role_ROLE_NODE {
				t.Fatalf("query role %v", r)
			}
		}
	})
}
