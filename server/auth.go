package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/authz"
)

// tokenMetadataKey carries "Bearer TOKEN" (client.TokenMetadataKey).
const tokenMetadataKey = "authorization"

// caller is who sent a request, as far as the node can tell.
type caller struct {
	name  string // certificate common name, or "token ID", for messages
	owner string // Command.owner of its commands: "cert:CN" or "token:ID"
	role  pb.Role
	// root is the directory the caller is confined to (its token's or
	// certificate's path; docs/security.md, "Confinement"); "": none.
	root string
}

// identify finds the caller's role: a verified client certificate of the
// cluster's CA, else a bearer token stored in the replicated state and not
// expired (against this node's clock). A follower judges tokens by its own
// applied state, so a token works there, and stops working after a revoke,
// once the follower has applied the entry.
func (n *Node) identify(ctx context.Context) (caller, error) {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			leaf := ti.State.VerifiedChains[0][0]
			cn := leaf.Subject.CommonName
			c := caller{name: cn, owner: "cert:" + cn, role: authz.CertRole(leaf)}
			root, err := authz.CertPath(leaf)
			if err != nil {
				return caller{}, status.Errorf(codes.Unauthenticated, "certificate %s: %v", cn, err)
			}
			if root != "" {
				if err := fsm.CheckRoot(root); err != nil || c.role > pb.Role_ROLE_WRITE {
					return caller{}, status.Errorf(codes.Unauthenticated, "certificate %s: confinement %q refused (a clean absolute path, read and write roles only)", cn, root)
				}
				// Certificates of one name with different paths are
				// different identities: they share no session.
				sum := sha256.Sum256([]byte(root))
				c.root, c.owner = root, c.owner+" path:"+hex.EncodeToString(sum[:8])
				c.name = cn + " (confined to " + root + ")"
			}
			return c, nil
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(tokenMetadataKey)
	if len(vals) == 0 {
		return caller{}, status.Error(codes.Unauthenticated, "no client certificate or token: give --cert/--key or --token-file (docs/security.md)")
	}
	text, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || text == "" {
		return caller{}, status.Error(codes.Unauthenticated, "authorization is not a bearer token")
	}
	tok := n.fsm.Token(authz.TokenHash(text))
	if tok == nil {
		return caller{}, status.Error(codes.Unauthenticated, "unknown or revoked token")
	}
	if tok.ExpiresNs != 0 && time.Now().UnixNano() >= tok.ExpiresNs {
		return caller{}, status.Errorf(codes.Unauthenticated, "token %s expired at %s", tok.Id,
			time.Unix(0, tok.ExpiresNs).UTC().Format(time.RFC3339))
	}
	c := caller{name: "token " + tok.Id, owner: "token:" + tok.Id, role: tok.Role, root: tok.Path}
	if c.root != "" {
		c.name += " (confined to " + c.root + ")"
	}
	return c, nil
}

// authorize refuses a request whose caller lacks the role its method (and
// command or query) needs, before any work, and returns the caller. A node
// without TLS (--insecure) cannot tell callers apart: it authorizes
// everything, as if each were a node, and their owner is "".
func (n *Node) authorize(ctx context.Context, method string, req any) (caller, error) {
	if n.cfg.TLS == nil {
		return caller{role: pb.Role_ROLE_NODE}, nil
	}
	need := authz.Method(method)
	switch r := req.(type) {
	case *pb.ApplyRequest:
		need = max(need, authz.Command(r.GetCommand()))
	case *pb.QueryRequest:
		need = max(need, authz.Query(r.GetQuery()))
	}
	c, err := n.identify(ctx)
	if err != nil {
		return caller{}, err
	}
	name := method[strings.LastIndexByte(method, '/')+1:]
	if c.role < need {
		return caller{}, status.Errorf(codes.PermissionDenied, "%s (role %s) may not call %s: it needs role %s",
			c.name, authz.RoleName(c.role), name, authz.RoleName(need))
	}
	if c.root != "" {
		if need >= pb.Role_ROLE_ADMIN {
			return caller{}, status.Errorf(codes.PermissionDenied, "%s may not call %s: it is confined to a directory", c.name, name)
		}
		if err := n.outside(c, req); err != nil {
			return caller{}, err
		}
	}
	return c, nil
}

// outside refuses, before any work, a request of a confined caller that
// names by number an inode outside its directory in this node's state.
// The state machine checks again when the request runs.
func (n *Node) outside(c caller, req any) error {
	var m proto.Message
	switch r := req.(type) {
	case *pb.ApplyRequest:
		m = r.GetCommand()
	case *pb.QueryRequest:
		m = r.GetQuery()
	}
	if m == nil {
		return nil
	}
	if err := n.fsm.Outside(c.root, c.owner, m); err != nil {
		return status.Errorf(codes.PermissionDenied, "%s: %v", c.name, err)
	}
	return nil
}

// stampOwner sets a command's owner and root to its caller's, unless a
// node forwarded it: the node that took it from the client stamped them
// already.
func stampOwner(ctx context.Context, cmd *pb.Command, c caller) {
	if cmd == nil || c.role == pb.Role_ROLE_NODE && isForwarded(ctx) {
		return
	}
	cmd.Owner, cmd.Root = c.owner, c.root
}

// stampQuery does for a query what stampOwner does for a command.
func stampQuery(ctx context.Context, q *pb.Query, c caller) {
	if q == nil || c.role == pb.Role_ROLE_NODE && isForwarded(ctx) {
		return
	}
	q.Owner, q.Root = c.owner, c.root
}

func (n *Node) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c, err := n.authorize(ctx, info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	switch r := req.(type) {
	case *pb.ApplyRequest:
		stampOwner(ctx, r.GetCommand(), c)
	case *pb.QueryRequest:
		stampQuery(ctx, r.GetQuery(), c)
	}
	return handler(ctx, req)
}

// authStream judges a stream by its method alone: a Write stream's
// command is a write (service.Write refuses any other), and the other
// streams carry no command.
func (n *Node) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c, err := n.authorize(ss.Context(), info.FullMethod, nil)
	if err != nil {
		return err
	}
	return handler(srv, &ownerStream{ServerStream: ss, n: n, caller: c, ctx: context.WithValue(ss.Context(), callerKey{}, c)})
}

// callerKey holds the caller in a stream's context (Watch filters by it).
type callerKey struct{}

// callerOf returns the caller authStream found, if any.
func callerOf(ctx context.Context) (caller, bool) {
	c, ok := ctx.Value(callerKey{}).(caller)
	return c, ok
}

// ownerStream stamps the owner on the command a Write stream carries.
type ownerStream struct {
	grpc.ServerStream
	n      *Node
	caller caller
	ctx    context.Context
}

func (s *ownerStream) Context() context.Context { return s.ctx }

// RecvMsg stamps the command of a Write stream and the query of a Read
// stream, and refuses, for a confined caller, one naming an inode
// outside its directory.
func (s *ownerStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err != nil {
		return err
	}
	switch f := m.(type) {
	case *pb.WriteFrame:
		if s.caller.root != "" && f.GetCommand() != nil {
			if err := s.n.outside(s.caller, &pb.ApplyRequest{Command: f.GetCommand()}); err != nil {
				return err
			}
		}
		stampOwner(s.Context(), f.GetCommand(), s.caller)
	case *pb.QueryRequest:
		if s.caller.root != "" {
			if err := s.n.outside(s.caller, f); err != nil {
				return err
			}
		}
		stampQuery(s.Context(), f.GetQuery(), s.caller)
	}
	return nil
}
