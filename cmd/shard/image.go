package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/termsafe"
	"github.com/useshards/shard/internal/units"
	"golang.org/x/term"
)

func newImageCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "image",
		Aliases: []string{"images"},
		Short:   "Manage the server's image cache: pull, ls, rm, import",
	}
	var quiet bool
	pull := &cobra.Command{
		Use:   "pull IMAGE",
		Short: "Pull an image from a registry into the cache",
		Args:  exactArgs(1, "an IMAGE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			img, err := pullWithProgress(cmd.Context(), c, args[0], quiet || a.json)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(img)
			}
			termsafe.Printf("%s %s\n", img.Name, img.Digest)
			return nil
		},
	}
	pull.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	pull.Flags().BoolVar(&a.json, "json", false, "print JSON")
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List cached images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			imgs, err := c.Images(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(imgs)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "NAME\tDIGEST\tLAYERS\tSIZE\tPULLED\n")
			for _, i := range imgs {
				d := i.Digest
				if len(d) > 19 {
					d = d[:19]
				}
				termsafe.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", i.Name, d, i.Layers, units.FormatSize(i.Size), ago(i.Created))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:     "rm IMAGE...",
		Aliases: []string{"remove"},
		Short:   "Remove images from the cache (not while a sandbox uses them; a pulled image, which every project shares, only with an admin key)",
		Args:    minArgs(1, "one or more IMAGE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			for _, ref := range args {
				if err := c.RemoveImage(cmd.Context(), ref); err != nil {
					return err
				}
				termsafe.Println(ref)
			}
			return nil
		},
	}
	var name string
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Import an OCI layout tarball or a docker-archive (docker save) into the project's images",
		Long: `Import an OCI layout tarball or a docker-archive (docker save), gzipped or
not. An imported image belongs to the key's project and is named under
localhost/ (localhost/NAME[:TAG]), so that it never stands for a registry's
image nor another project's: --name must be such a name, and the archive's
own names are moved there (an archive of python:3.12-slim is imported as
localhost/python:3.12-slim; "python:3.12-slim" still means the registry's).
Create from it by that name: shard create localhost/myapp:1.`,
		Example: `  docker save myapp:1 | gzip > myapp.tar.gz && shard image import myapp.tar.gz
  shard image import --name localhost/tools:2 tools-oci.tar`,
		Args: exactArgs(1, "a FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name != "" {
				if err := names.ImageRef(name); err != nil {
					return fmt.Errorf("--name: %w", err)
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			imgs, err := c.ImportImage(cmd.Context(), f, name)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(imgs)
			}
			for _, i := range imgs {
				termsafe.Printf("%s %s\n", i.Name, i.Digest)
			}
			return nil
		},
	}
	imp.Flags().StringVar(&name, "name", "", "name to give the image, localhost/NAME[:TAG] (needed when the archive has none)")
	imp.Flags().BoolVar(&a.json, "json", false, "print JSON")
	inspect := &cobra.Command{
		Use:   "inspect IMAGE",
		Short: "Show a cached image as JSON: name, reference, digest, size, layers, when pulled",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			img, err := c.Image(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(img)
		},
	}
	cmd.AddCommand(pull, ls, inspect, rm, imp)
	return cmd
}

// pullWithProgress pulls, drawing a progress bar on a terminal.
func pullWithProgress(ctx context.Context, c *client.Client, ref string, quiet bool) (*client.Image, error) {
	if quiet || !term.IsTerminal(int(os.Stderr.Fd())) {
		return c.Pull(ctx, ref, nil)
	}
	var bar *progressbar.ProgressBar
	img, err := c.Pull(ctx, ref, func(ev client.PullEvent) {
		if ev.Total <= 0 {
			return
		}
		if bar == nil {
			bar = progressbar.NewOptions64(ev.Total,
				progressbar.OptionSetWriter(os.Stderr),
				progressbar.OptionSetDescription("pulling "+termsafe.Escape(ref)),
				progressbar.OptionShowBytes(true),
				progressbar.OptionSetWidth(30),
				progressbar.OptionThrottle(100_000_000),
				progressbar.OptionClearOnFinish())
		}
		bar.ChangeMax64(ev.Total)
		bar.Set64(ev.Done)
	})
	if bar != nil {
		bar.Finish()
	}
	return img, err
}
