package trainer

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Ticks are round values 1, 2 or 5 times a power of ten apart, five to ten of
// them, inside the range.
func TestTicks(t *testing.T) {
	assert.Equal(t, []float64{0, 50, 100, 150, 200, 250, 300}, ticks(0, 300))
	assert.Equal(t, []float64{2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5}, roundAll(ticks(1.52, 5.51)))
	assert.Equal(t, []float64{0, 1, 2, 3, 4, 5, 6, 7, 8}, ticks(0, 8))
	for _, r := range [][2]float64{{0, 1}, {1.5, 1.6}, {0, 1e6}, {3.1, 3.10001}} {
		ts := ticks(r[0], r[1])
		assert.GreaterOrEqual(t, len(ts), 2, "%v", r)
		assert.LessOrEqual(t, len(ts), 11, "%v", r)
		for _, v := range ts {
			assert.True(t, v >= r[0]-1e-9*(r[1]-r[0]) && v <= r[1]+1e-9*(r[1]-r[0]), "%v outside %v", v, r)
		}
	}
	assert.Equal(t, "0", formatTick(1e-17))
	assert.Equal(t, "2.5", formatTick(2.5000000000000004))
}

func roundAll(xs []float64) []float64 {
	for i := range xs {
		xs[i] = float64(int(xs[i]*1000+0.5)) / 1000
	}
	return xs
}

// The plot is drawn with labels (dark text pixels left of the y axis and below
// the x axis), and a non-finite validation loss is left out rather than drawn.
func TestLossPlotHasLabelledAxes(t *testing.T) {
	nan := 0.0
	nan /= nan
	v := 2.0
	curve := []Metrics{{Step: 1, Loss: 5}, {Step: 2, Loss: 4, ValLoss: &v}, {Step: 3, Loss: 3, ValLoss: &nan}}
	path := filepath.Join(t.TempDir(), "loss.png")
	require.NoError(t, writeLossPNG(path, "t", curve))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	dark := func(x0, y0, x1, y1 int) int {
		n := 0
		for x := x0; x < x1; x++ {
			for y := y0; y < y1; y++ {
				if r, _, _, _ := img.At(x, y).RGBA(); r < 0x8000 {
					n++
				}
			}
		}
		return n
	}
	assert.Greater(t, dark(0, 36, 56, 432), 50, "y tick labels")
	assert.Greater(t, dark(64, 436, 776, 470), 50, "x tick labels and title")
}

// The run's name is the plot's title, centred above the plot between the y
// axis title and the legend; a long name is cut so that it never reaches the
// legend.
func TestLossPlotTitleIsRunName(t *testing.T) {
	curve := []Metrics{{Step: 1, Loss: 5}, {Step: 2, Loss: 4}}
	titleRow := func(name string) (inside, beyond int) {
		path := filepath.Join(t.TempDir(), "loss.png")
		require.NoError(t, writeLossPNG(path, name, curve))
		f, err := os.Open(path)
		require.NoError(t, err)
		defer f.Close()
		img, err := png.Decode(f)
		require.NoError(t, err)
		for x := 96; x < 586; x++ {
			for y := 8; y < 26; y++ {
				if r, _, _, _ := img.At(x, y).RGBA(); r < 0x8000 {
					if x < 570 {
						inside++
					} else {
						beyond++
					}
				}
			}
		}
		return inside, beyond
	}
	none, _ := titleRow("")
	assert.Zero(t, none, "no name, no title")
	named, _ := titleRow("tiny-moe")
	assert.Greater(t, named, 20, "the name is drawn")
	long, beyond := titleRow(strings.Repeat("W", 300))
	assert.Greater(t, long, named)
	assert.Zero(t, beyond, "a long name stops short of the legend")
}
