// The --svg plot of `hybridkv sim`: reuse so far against its bound (one scale, chosen from the
// data), and the GPU use of each pool group, over scheduler steps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "sim_internal.h"

namespace hybridkv::tools {
namespace {

// 1, 2 or 5 times a power of ten: the tick step that gives about `ticks` ticks up to `max`.
double nice_step(double max, int ticks) {
  const double raw = std::max(max, 1.0) / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * power) return m * power;
  }
  return 10 * power;
}

std::string num(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", v);
  return buffer;
}

std::string tokens_label(double v) {
  char buffer[32];
  if (v >= 1e6)
    std::snprintf(buffer, sizeof(buffer), "%gM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buffer, sizeof(buffer), "%gk", v / 1e3);
  else
    std::snprintf(buffer, sizeof(buffer), "%g", v);
  return buffer;
}

struct Panel {
  double left, top, width, height;
  double x_max, y_max;
  double x(double v) const { return left + width * v / x_max; }
  double y(double v) const { return top + height * (1 - std::min(v / y_max, 1.0)); }
};

std::string frame(const Panel& p, const std::string& y_title, double y_step, bool percent) {
  std::string s = "<rect x='" + num(p.left) + "' y='" + num(p.top) + "' width='" + num(p.width) +
                  "' height='" + num(p.height) + "' fill='none' stroke='#888'/>\n";
  for (double v = 0; v <= p.y_max + 1e-9; v += y_step) {
    const std::string label =
        percent ? num(v * 100).substr(0, num(v * 100).find('.')) + "%" : tokens_label(v);
    s += "<line x1='" + num(p.left) + "' x2='" + num(p.left + p.width) + "' y1='" + num(p.y(v)) +
         "' y2='" + num(p.y(v)) + "' stroke='#eee'/>\n";
    s += "<text x='" + num(p.left - 6) + "' y='" + num(p.y(v) + 4) + "' text-anchor='end'>" +
         label + "</text>\n";
  }
  const double x_step = nice_step(p.x_max, 6);
  for (double v = 0; v <= p.x_max + 1e-9; v += x_step) {
    s += "<text x='" + num(p.x(v)) + "' y='" + num(p.top + p.height + 14) +
         "' text-anchor='middle'>" + tokens_label(v) + "</text>\n";
  }
  s += "<text x='" + num(p.left) + "' y='" + num(p.top - 6) + "'>" + y_title + "</text>\n";
  return s;
}

template <typename Value>
std::string line(const Panel& p, const std::vector<Sample>& samples, Value value,
                 const std::string& color) {
  std::string d;
  for (const Sample& s : samples) {
    const std::optional<double> v = value(s);
    if (!v) continue;
    d += (d.empty() ? "M" : " L") + num(p.x(static_cast<double>(s.step))) + " " + num(p.y(*v));
  }
  return "<path d='" + d + "' fill='none' stroke='" + color + "' stroke-width='2'/>\n";
}

}  // namespace

std::string svg_plot(const std::vector<Sample>& samples,
                     const std::vector<std::string>& pool_group_names, const std::string& title) {
  const char* colors[] = {"#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"};
  const double steps = samples.empty() ? 1 : std::max<double>(1, samples.back().step);
  double top_value = 1;
  for (const Sample& s : samples) top_value = std::max<double>(top_value, s.bound);
  const double y_step = nice_step(top_value, 5);
  const Panel reuse{80, 50, 690, 220, steps, std::ceil(top_value / y_step) * y_step};
  const Panel memory{80, 320, 690, 120, steps, 1.0};
  std::string s =
      "<svg xmlns='http://www.w3.org/2000/svg' width='800' height='520' font-family='sans-serif' "
      "font-size='12'>\n<rect width='800' height='520' fill='white'/>\n";
  s += "<text x='80' y='22' font-size='14'>" + title + "</text>\n";
  s += frame(reuse, "prompt tokens reused so far", y_step, false);
  s += line(
      reuse, samples, [](const Sample& x) { return std::optional<double>(x.bound); }, "#999");
  s += line(
      reuse, samples, [](const Sample& x) { return std::optional<double>(x.reused); }, "#1f77b4");
  s += "<text x='560' y='70' fill='#1f77b4'>reused</text>\n";
  s += "<text x='560' y='86' fill='#777'>bound (unlimited memory)</text>\n";
  s += frame(memory, "GPU slots in use, by pool group", 0.25, true);
  for (size_t g = 0; g < pool_group_names.size(); ++g) {
    const std::string color = colors[g % 5];
    s += line(
        memory, samples,
        [g](const Sample& x) -> std::optional<double> {
          if (g >= x.gpu_used.size()) return std::nullopt;
          return x.gpu_used[g];
        },
        color);
    s += "<text x='" + num(80 + 170.0 * static_cast<double>(g)) + "' y='490' fill='" + color +
         "'>" + pool_group_names[g] + "</text>\n";
  }
  s += "<text x='80' y='510'>x: scheduler steps (" + std::to_string(static_cast<uint64_t>(steps)) +
       " in all)</text>\n</svg>\n";
  return s;
}

}  // namespace hybridkv::tools
