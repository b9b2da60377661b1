package main

import (
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/cronstream/cronstream/internal/redact"
)

func init() { subcommands = append(subcommands, newHealthcheckCommand) }

// newHealthcheckCommand probes a replica's HTTP endpoint, for container
// health checks on images without curl.
func newHealthcheckCommand(*globalFlags) *cobra.Command {
	var url string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:     "healthcheck",
		Short:   "Exit 0 when a replica's health endpoint answers 200 (for container health checks)",
		Example: `  cronstream healthcheck --url http://127.0.0.1:8080/readyz`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := &http.Client{Timeout: timeout}
			resp, err := c.Get(url)
			if err != nil {
				return redact.ParseError(err) // net/http hides a password, a parse error would not
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s answered %s", redact.URL(url), resp.Status)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "url", "http://127.0.0.1:8080/healthz", "endpoint to probe")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for the answer")
	return cmd
}
