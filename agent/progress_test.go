package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTimeLeft(t *testing.T) {
	require.Equal(t, "about 3m0s left", timeLeft(time.Minute, 25, 100))
	require.Equal(t, "about 1s left", timeLeft(10*time.Second, 900, 1000))
	require.Empty(t, timeLeft(500*time.Millisecond, 25, 100), "too early to say")
	require.Empty(t, timeLeft(time.Minute, 0, 100), "nothing done yet")
	require.Empty(t, timeLeft(time.Minute, 100, 100), "done")
}
