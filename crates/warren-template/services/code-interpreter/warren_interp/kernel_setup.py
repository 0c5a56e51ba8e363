"""Run by every Python kernel at start (IPKernelApp.exec_files in the kernel spec).

Adds two display formats that IPython does not have, so that the server can pass them on:
  e2b/chart  the data of a matplotlib figure (charts.py), next to its PNG
  e2b/data   a pandas DataFrame as {column: [values]}, next to its HTML table
Objects are recognised through sys.modules: nothing is imported here, so a kernel that never
touches matplotlib or pandas pays nothing for them.

And, as E2B's kernels do, PIL images are shown as results: `image.show()` displays the image
(there is no screen to open a viewer on) and `image.save(path)` displays it too. PIL is patched
when user code first imports it, by a one-shot import hook.

Everything lives inside one function that deletes itself, so the user's namespace starts clean.
"""


def _warren_kernel_setup():
    import importlib.abc
    import importlib.util
    import json
    import os
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import Unicode

    lib_dir = "/usr/local/lib/warren-interp"
    sys.path.insert(0, lib_dir)
    try:
        from warren_interp import charts
    finally:
        sys.path.remove(lib_dir)

    def dataframe_data(df):
        # Through pandas' own JSON writer: it knows how to encode numpy scalars, NaN and dates.
        return {str(col): json.loads(df[col].to_json(orient="values", date_format="iso"))
                for col in df.columns}

    def instance_of(obj, module, name):
        # Checked by name through sys.modules: never imports matplotlib or pandas itself.
        cls = getattr(sys.modules.get(module), name, None)
        return cls is not None and isinstance(obj, cls)

    class ObjectFormatter(BaseFormatter):
        """A formatter that recognises its objects itself.

        Not through IPython's type registry: activating the inline matplotlib backend removes
        every formatter's Figure entry (it re-registers only its own image formats).
        """

        _return_type = (dict,)
        module = name = convert = None

        def __call__(self, obj):
            if self.enabled and instance_of(obj, self.module, self.name):
                try:
                    return self.convert(obj)
                except Exception:  # a chart we cannot read still has its PNG
                    return None
            return None

    class ChartFormatter(ObjectFormatter):
        format_type = Unicode("e2b/chart")
        module, name = "matplotlib.figure", "Figure"
        convert = staticmethod(charts.chart_from_figure)

    class DataFormatter(ObjectFormatter):
        format_type = Unicode("e2b/data")
        module, name = "pandas.core.frame", "DataFrame"
        convert = staticmethod(dataframe_data)

    def patch_pil(image_module):
        from IPython.display import display as show

        def show_image(self, title=None):
            show(self)

        original_save = image_module.Image.save

        def save(self, fp, format=None, **params):
            if isinstance(fp, (str, os.PathLike)):
                show(self)
            return original_save(self, fp, format, **params)

        image_module.Image.show = show_image
        image_module.Image.save = save

    class PilHook(importlib.abc.MetaPathFinder):
        """Patches PIL.Image right after its first import, then leaves sys.meta_path."""

        def find_spec(self, name, path, target=None):
            if name != "PIL.Image":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                try:
                    patch_pil(module)
                except Exception:  # an unexpected PIL: images are simply not shown
                    pass

            spec.loader.exec_module = exec_module
            return spec

    if "PIL.Image" in sys.modules:
        patch_pil(sys.modules["PIL.Image"])
    else:
        sys.meta_path.insert(0, PilHook())

    display = get_ipython().display_formatter
    for formatter_class in (ChartFormatter, DataFormatter):
        formatter = formatter_class(parent=display)
        display.formatters[formatter.format_type] = formatter
        if formatter.format_type not in display.active_types:
            display.active_types.append(formatter.format_type)


_warren_kernel_setup()
del _warren_kernel_setup
