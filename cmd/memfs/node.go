package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/memoryfs/memfs/proto"
)

var nodeCmd = &cobra.Command{
	Use:   "node",
	Short: "Manage cluster membership",
}

var nodeRemoveCmd = &cobra.Command{
	Use:   "remove ID",
	Short: "Remove a node from the cluster (stop its process afterwards)",
	Args:  cobra.ExactArgs(1),
	RunE: func(cmd *cobra.Command, args []string) error {
		ctx, cancel := commandContext()
		defer cancel()
		err := callCluster(ctx, func(ctx context.Context, c pb.MemFSClient) error {
			_, err := c.RemoveNode(ctx, &pb.RemoveNodeRequest{Version: pb.Version, Id: args[0]})
			return err
		})
		if err != nil {
			return fmt.Errorf("remove node %s: %w", args[0], err)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "removed node %s\n", args[0])
		return nil
	},
}

func init() {
	nodeCmd.AddCommand(nodeRemoveCmd)
	rootCmd.AddCommand(nodeCmd)
}
