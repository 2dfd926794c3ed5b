package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/spf13/cobra"
)

func (a *app) ckptCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ckpt", Short: "List, inspect and verify checkpoints",
		Long: `Checkpoints are written under checkpoint.dir (default <run dir>/checkpoints), one
step-NNNNNNNN directory each: every rank's file of its state, and metadata.json,
written last (a directory without it is a save that did not finish).
docs/checkpoints.md describes the format.`}
	cmd.AddCommand(&cobra.Command{
		Use:   "ls DIR",
		Short: "List the checkpoints under a run directory or checkpoint root",
		Long: `List shows each step-NNNNNNNN directory under DIR: a complete checkpoint with
the step, world size, strategy and expert parallelism its metadata.json records
(checked as ckpt inspect checks it; a directory whose name gives another step is
listed with its metadata's step and says so), an incomplete one (a save that did
not finish) with the step its name gives.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			root := args[0]
			if isDirectory(root + "/checkpoints") {
				root += "/checkpoints"
			}
			es, err := ckpt.List(root)
			if err != nil {
				return usageErr("%s: %v", args[0], unwrap(err))
			}
			if len(es) == 0 {
				return &exitError{code: exitFindings, err: fmt.Errorf("no checkpoints under %s", root)}
			}
			w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "STEP\tSTATUS\tWORLD\tSTRATEGY\tEP\tDIR")
			for _, e := range es {
				if !e.Complete {
					fmt.Fprintf(w, "%d\tincomplete\t\t\t\t%s\n", e.Step, e.Dir)
					continue
				}
				m, err := ckpt.Open(e.Dir)
				if err != nil {
					fmt.Fprintf(w, "%d\tunreadable: %v\t\t\t\t%s\n", e.Step, err, e.Dir)
					continue
				}
				status := "complete"
				if m.Step != e.Step { // the step is the metadata's; a renamed directory does not change it
					status = fmt.Sprintf("complete, but its directory is named for step %d", e.Step)
				}
				fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%d\t%s\n", m.Step, status, m.WorldSize, m.Strategy, m.ExpertParallel, e.Dir)
			}
			return w.Flush()
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "inspect CHECKPOINT_DIR",
		Short: "Print a checkpoint's metadata and tensor table",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			dir, err := findCheckpoint(args[0])
			if err != nil {
				return usageErr("%s: %v", args[0], err)
			}
			m, err := ckpt.Open(dir)
			if err != nil {
				return &exitError{code: exitFindings, err: err}
			}
			var bytes int64
			for _, f := range m.Files {
				bytes += f.Size
			}
			fmt.Fprintf(a.stdout, "checkpoint %s\nstep %d (optimizer steps %d), %d ranks, %s, expert parallel %d\nrecipe %s\nplan %s\ndata %s\nrun %s (id %s)\nfiles %d, %d bytes; the save held training for %.1f ms\nstate per piece: %s\n\n",
				dir, m.Step, m.OptimizerSteps, m.WorldSize, m.Strategy, m.ExpertParallel, m.RecipeFingerprint, m.PlanFingerprint, m.DataFingerprint,
				m.RunDir, m.RunID, len(m.Files), bytes, m.SaveBlockedS*1e3, strings.Join(m.States, ", "))
			w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TENSOR\tSHAPE\tDTYPE\tPIECES (start+count@file:offset)")
			for _, t := range m.Tensors {
				var ps []string
				for _, p := range t.Pieces {
					ps = append(ps, fmt.Sprintf("%d+%d@%s:%d", p.Start, p.Count, p.File, p.Offset))
				}
				fmt.Fprintf(w, "%s\t%v\t%s\t%s\n", t.Name, t.Shape, t.Dtype, strings.Join(ps, " "))
			}
			return w.Flush()
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "verify CHECKPOINT_DIR",
		Short: "Read every piece of a checkpoint and check its checksum",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			dir, err := findCheckpoint(args[0])
			if err != nil {
				return usageErr("%s: %v", args[0], err)
			}
			n, err := ckpt.Verify(dir)
			if err != nil {
				return &exitError{code: exitFindings, err: err}
			}
			_, err = fmt.Fprintf(a.stdout, "%s: ok, %d bytes checked\n", dir, n)
			return err
		},
	})
	cmd.AddCommand(a.ckptExportCmd(), a.ckptImportCmd())
	return cmd
}
