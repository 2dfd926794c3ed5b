package trainer

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"strconv"

	"github.com/shardline/shardline/fileio"
	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// writeLossPNG draws the training loss (blue, every step) and the validation loss
// (red dots) against the step: the x axis in steps from 0 to the last step, the y
// axis in nats from the lowest to the highest loss, each with round-numbered,
// labelled ticks and a light grid at each, axis titles, a legend, and the run's
// name as the title (cut to titleRunes). The file is replaced atomically: a
// viewer open on it during a run sees the old plot or the new one.
func writeLossPNG(path, name string, curve []Metrics) error {
	const W, H = 800, 480
	const left, right, top, bottom = 64, 24, 36, 48
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, m := range curve {
		for _, v := range []float64{m.Loss, valOr(m, m.Loss)} {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if len(curve) == 0 || math.IsInf(lo, 0) {
		return savePNG(path, img)
	}
	if hi-lo < 1e-9 {
		hi = lo + 1
	}
	steps := math.Max(float64(curve[len(curve)-1].Step), 1)
	x := func(step float64) int { return left + int(step/steps*float64(W-left-right)) }
	y := func(v float64) int { return H - bottom - int((v-lo)/(hi-lo)*float64(H-top-bottom)) }
	grid, black := color.RGBA{225, 225, 225, 255}, color.RGBA{0, 0, 0, 255}
	for _, v := range ticks(0, steps) {
		line(img, x(v), top, x(v), H-bottom, grid)
		line(img, x(v), H-bottom, x(v), H-bottom+4, black)
		label(img, x(v), H-bottom+18, formatTick(v), 0.5)
	}
	for _, v := range ticks(lo, hi) {
		line(img, left, y(v), W-right, y(v), grid)
		line(img, left-4, y(v), left, y(v), black)
		label(img, left-8, y(v)+4, formatTick(v), 1)
	}
	line(img, left, H-bottom, W-right, H-bottom, black)
	line(img, left, top, left, H-bottom, black)
	label(img, (left+W-right)/2, H-8, "step", 0.5)
	label(img, 8, 22, "loss (nats)", 0)
	if r := []rune(name); len(r) > titleRunes {
		name = string(r[:titleRunes-3]) + "..."
	}
	// Centred between the y axis title and the legend.
	label(img, (100+W-right-200)/2, 22, name, 0.5)
	blue, red := color.RGBA{31, 119, 180, 255}, color.RGBA{214, 39, 40, 255}
	line(img, W-right-190, 18, W-right-170, 18, blue)
	label(img, W-right-164, 22, "train", 0)
	dot(img, W-right-90, 18, red)
	label(img, W-right-80, 22, "validation", 0)
	for i := 1; i < len(curve); i++ {
		a, b := curve[i-1], curve[i]
		if math.IsNaN(a.Loss) || math.IsNaN(b.Loss) {
			continue
		}
		line(img, x(float64(a.Step)), y(a.Loss), x(float64(b.Step)), y(b.Loss), blue)
	}
	for _, m := range curve {
		if m.ValLoss != nil && !math.IsNaN(*m.ValLoss) {
			dot(img, x(float64(m.Step)), y(*m.ValLoss), red)
		}
	}
	return savePNG(path, img)
}

// titleRunes is the longest title drawn whole: the room between the y axis
// title and the legend in the 7-pixel font.
const titleRunes = 64

// dot draws a filled circle of radius 3.
func dot(img *image.RGBA, cx, cy int, c color.RGBA) {
	for dx := -3; dx <= 3; dx++ {
		for dy := -3; dy <= 3; dy++ {
			if dx*dx+dy*dy <= 9 {
				img.Set(cx+dx, cy+dy, c)
			}
		}
	}
}

// ticks returns round values (1, 2 or 5 times a power of ten apart) covering
// [lo, hi] with about five to ten of them.
func ticks(lo, hi float64) []float64 {
	span := hi - lo
	step := math.Pow(10, math.Floor(math.Log10(span/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if span/(step*m) <= 10 {
			step *= m
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step-1e-9) * step; v <= hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

// formatTick writes a tick value with no more digits than it needs.
func formatTick(v float64) string {
	if math.Abs(v) < 1e-12 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}

// label draws text with its baseline at y; align 0 puts x at the text's left
// edge, 0.5 at its centre, 1 at its right edge.
func label(img *image.RGBA, x, y int, text string, align float64) {
	face := basicfont.Face7x13
	d := &font.Drawer{Dst: img, Src: image.NewUniform(color.RGBA{60, 60, 60, 255}), Face: face}
	w := d.MeasureString(text).Round()
	d.Dot = fixed.P(x-int(align*float64(w)), y)
	d.DrawString(text)
}

func valOr(m Metrics, d float64) float64 {
	if m.ValLoss != nil {
		return *m.ValLoss
	}
	return d
}

// line draws with Bresenham's algorithm.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	err := dx + dy
	for {
		img.SetRGBA(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// savePNG writes img to path, atomically and never through a link.
func savePNG(path string, img image.Image) error {
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return err
	}
	return fileio.WriteAtomic(path, b.Bytes())
}
