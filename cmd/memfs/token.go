package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/fsm"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/authz"
)

type tokenOptions struct {
	role, name, out, path string
	ttl                   time.Duration
}

func newTokenCmd() *cobra.Command {
	o := &tokenOptions{}
	tokenCmd := &cobra.Command{
		Use:   "token",
		Short: "Make, list and revoke bearer tokens (admin)",
		Long: `A token authenticates a client that has no certificate (--token-file or
MEMFS_TOKEN_FILE, over TLS only) with the role it was made with. The
cluster stores only its SHA-256; the text is printed once, by create.

  memfs token create --role write --name ci --ttl 720h --out ci.token
  memfs token create --role write --path /tenants/a --out a.token   # sees /tenants/a as /
  memfs token list
  memfs token revoke ID`,
	}
	create := &cobra.Command{
		Use: "create", Short: "Make a token and print it (once)", Args: cobra.NoArgs,
		RunE: clientRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string) error {
			role, err := authz.ParseRole(o.role)
			if err != nil || role == pb.Role_ROLE_NODE {
				return usageError{fmt.Errorf("--role %q: want read, write or admin", o.role)}
			}
			if o.path != "" {
				if role == pb.Role_ROLE_ADMIN {
					return usageError{errors.New("--path: an admin token cannot be confined (it could make tokens for any path)")}
				}
				if err := fsm.CheckRoot(o.path); err != nil {
					return usageError{fmt.Errorf("--path: %w", err)}
				}
			}
			if o.ttl < 0 {
				return usageError{errors.New("--ttl must not be negative")}
			}
			var raw [32]byte
			if _, err := rand.Read(raw[:]); err != nil {
				return err
			}
			text := "memfs_" + base64.RawURLEncoding.EncodeToString(raw[:])
			res, err := c.Do(ctx, &pb.Command{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{
				Hash: authz.TokenHash(text), Role: role, Name: o.name, TtlMs: o.ttl.Milliseconds(), Path: o.path}}})
			if err != nil {
				return err
			}
			tok := res.GetTokens()[0]
			if o.out != "" {
				if err := os.WriteFile(o.out, []byte(text+"\n"), 0o600); err != nil {
					return fmt.Errorf("token %s was made but not written: %w (revoke it)", tok.Id, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "token %s (role %s) written to %s\n", tok.Id, authz.RoleName(tok.Role), o.out)
				return nil
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s (role %s); keep it secret, it is not shown again:\n", tok.Id, authz.RoleName(tok.Role))
			fmt.Fprintln(cmd.OutOrStdout(), text)
			return nil
		}),
	}
	f := create.Flags()
	f.StringVar(&o.role, "role", "", "read, write or admin (required)")
	f.StringVar(&o.name, "name", "", "a note on who or what the token is for")
	f.DurationVar(&o.ttl, "ttl", 0, "lifetime (0: until revoked)")
	f.StringVar(&o.path, "path", "", "confine the token to this directory, which its holder sees as / (read and write roles)")
	f.StringVar(&o.out, "out", "", "write the token to this file (mode 0600) instead of stdout")
	_ = create.MarkFlagRequired("role")

	list := &cobra.Command{
		Use: "list", Short: "List the tokens (never their text)", Args: cobra.NoArgs,
		RunE: clientRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, _ []string) error {
			res, err := c.Query(ctx, &pb.Query{Q: &pb.Query_Tokens{Tokens: &pb.TokensQuery{}}})
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tROLE\tPATH\tNAME\tCREATED\tEXPIRES")
			for _, t := range res.GetTokens() {
				exp := "never"
				if t.ExpiresNs != 0 {
					exp = time.Unix(0, t.ExpiresNs).UTC().Format(time.RFC3339)
				}
				path := t.Path
				if path == "" {
					path = "/"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Id, authz.RoleName(t.Role), path, t.Name,
					time.Unix(0, t.CreatedNs).UTC().Format(time.RFC3339), exp)
			}
			return w.Flush()
		}),
	}
	revoke := &cobra.Command{
		Use: "revoke ID", Short: "Revoke a token by its id", Args: cobra.ExactArgs(1),
		RunE: clientRun(func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			_, err := c.Do(ctx, &pb.Command{Op: &pb.Command_TokenRevoke{TokenRevoke: &pb.TokenRevokeCmd{Id: args[0]}}})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked token %s\n", args[0])
			return nil
		}),
	}
	tokenCmd.AddCommand(create, list, revoke)
	return tokenCmd
}
