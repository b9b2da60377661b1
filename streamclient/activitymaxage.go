package streamclient

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cronstream/cronstream/contract"
)

// ActivityMaxAge reads the activity stream's max age (0: kept forever).
func ActivityMaxAge(ctx context.Context, js jetstream.JetStream, names contract.Names) (time.Duration, error) {
	s, err := js.Stream(ctx, names.ActivityStream())
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", names.ActivityStream(), err)
	}
	return s.CachedInfo().Config.MaxAge, nil
}
