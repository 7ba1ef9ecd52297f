package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newCatCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "cat SANDBOX PATH",
		Short: "Print a file of a sandbox (running or stopped) to stdout",
		Long: `Print the bytes of the file at PATH (absolute) in a sandbox, running or
stopped, to stdout, streamed. A symlink is followed, inside the sandbox.
A directory is refused: copy it out with 'shard cp', or list it with 'shard ls'.`,
		Args: exactArgs(2, "a SANDBOX and a PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			rc, _, err := c.ReadFile(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			defer rc.Close()
			if _, err := io.Copy(os.Stdout, rc); err != nil {
				return fmt.Errorf("reading %s of %s broke off: %w", args[1], args[0], err)
			}
			return nil
		},
	}
}

func newWriteCmd(a *app) *cobra.Command {
	var (
		mode     string
		parents  bool
		uid, gid int
	)
	cmd := &cobra.Command{
		Use:   "write SANDBOX PATH",
		Short: "Write stdin to a file of a sandbox (running or stopped)",
		Long: `Write what stdin holds to the file at PATH (absolute) in a sandbox, running
or stopped, streamed. A file there is replaced whole, keeping its owner and
mode unless told otherwise; nothing is written unless all of stdin arrives.
A new file is owned by root with mode 0644. A symlink at PATH is followed,
inside the sandbox.

  echo 'print(1)' | shard write box /app/main.py
  shard write --mode 755 --parents box /opt/tool/run.sh < run.sh`,
		Args: exactArgs(2, "a SANDBOX and a PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			o := &client.WriteFileOptions{Parents: parents}
			if mode != "" {
				m, err := strconv.ParseUint(mode, 8, 32)
				if err != nil || m > 0o7777 {
					return fmt.Errorf("--mode %q: give the mode in octal, at most 7777 (e.g. 644)", mode)
				}
				m32 := uint32(m)
				o.Mode = &m32
			}
			if cmd.Flags().Changed("uid") {
				o.UID = &uid
			}
			if cmd.Flags().Changed("gid") {
				o.GID = &gid
			}
			res, err := c.WriteFile(cmd.Context(), args[0], args[1], os.Stdin, o)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(res)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "", "the file's mode, in octal (default: the replaced file's, or 644)")
	cmd.Flags().BoolVarP(&parents, "parents", "p", false, "make missing parent directories")
	cmd.Flags().IntVar(&uid, "uid", 0, "the file's owner (default: the replaced file's, or root)")
	cmd.Flags().IntVar(&gid, "gid", 0, "the file's group (default: the replaced file's, or root)")
	cmd.Flags().BoolVar(&a.json, "json", false, "print what was written as JSON")
	return cmd
}

func newLsCmd(a *app) *cobra.Command {
	var quiet, allProjects bool
	cmd := &cobra.Command{
		Use:   "ls [SANDBOX [PATH]]",
		Short: "List a directory of a sandbox (running or stopped); without arguments, the sandboxes",
		Long: `List the directory PATH (absolute, default /) of a sandbox, running or
stopped: mode, owner, size, modification time and name of each entry, a
symlink with what it points to. PATH may be a file, listed alone.

Without arguments 'shard ls' lists the sandboxes, as 'shard list' does.`,
		Args: cobra.MaximumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return listSandboxes(cmd, a, quiet, allProjects)
			}
			p := "/"
			if len(args) == 2 {
				p = args[1]
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.ListFiles(cmd.Context(), args[0], p)
			var ce *client.Error
			if err != nil && errors.As(err, &ce) && ce.Code == client.CodeNotADirectory {
				// A file is listed alone, as ls does.
				fi, serr := c.StatFile(cmd.Context(), args[0], p, false)
				if serr != nil {
					return serr
				}
				list, err = &client.FileList{Path: p, Entries: []client.FileInfo{*fi}}, nil
			}
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(list)
			}
			if quiet {
				for _, e := range list.Entries {
					termsafe.Println(e.Name)
				}
				return nil
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			for _, e := range list.Entries {
				name := e.Name
				if e.Type == "symlink" {
					name += " -> " + e.Link
				}
				termsafe.Fprintf(tw, "%s\t%d:%d\t%d\t%s\t%s\n", modeString(e), e.UID, e.GID, e.Size, e.MTime.Local().Format("2006-01-02 15:04"), name)
			}
			if list.Truncated {
				termsafe.Fprintf(tw, "(more entries than shown: the listing stops at %d)\n", len(list.Entries))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print names only (without arguments: sandbox ids)")
	cmd.Flags().BoolVar(&allProjects, "all-projects", false, "without arguments: list every project's sandboxes")
	return cmd
}

// modeString is e's type and mode as ls -l writes them.
func modeString(e client.FileInfo) string {
	m := fs.FileMode(e.Mode & 0o777)
	if e.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if e.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if e.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch e.Type {
	case "dir":
		m |= fs.ModeDir
	case "symlink":
		m |= fs.ModeSymlink
	case "fifo":
		m |= fs.ModeNamedPipe
	case "socket":
		m |= fs.ModeSocket
	case "char":
		m |= fs.ModeDevice | fs.ModeCharDevice
	case "block":
		m |= fs.ModeDevice
	}
	s := m.String()
	if e.Type == "symlink" {
		s = "l" + s[1:] // Go writes L; ls writes l
	}
	return s
}
