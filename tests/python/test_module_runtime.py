"""The module carries its own C++ runtime, hidden (CMakeLists.txt, docs/PYTHON.md "C++ runtime").

Why: a python3 process also holds other extensions' private copies of libstdc++ locale code (pip numpy
on the device image); with the shared libstdc++ the CUDA module crashed in std::ostream number
formatting once numpy was imported first (SIGSEGV in ostream::_M_insert<long>, measured on the H200
image 2026-12-01). The crash needs that image's numpy, so CI checks the property that removed it: the
module does not load libstdc++.so / libgcc_s.so itself, and exports no libstdc++ locale or ostream
symbol another library could bind to. Also the crashing call itself, after numpy, here."""
import os
import re
import subprocess
import unittest

from support import MODEL, moesq, np  # noqa: F401  (numpy imported before the module, as on the device)


def readelf(*args):
    r = subprocess.run(["readelf", *args, moesq.__file__], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("readelf %s %s failed: %s" % (" ".join(args), moesq.__file__, r.stderr))
    return r.stdout


@unittest.skipUnless(os.environ.get("MOESQ_PY_PRIVATE_RUNTIME") == "1",
                     "CMake linked the module's C++ runtime privately only for GCC on Linux")
class ModuleRuntime(unittest.TestCase):
    def test_no_shared_libstdcxx_needed(self):
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("-d"))
        self.assertTrue(needed, "no NEEDED entries parsed from readelf -d")
        self.assertFalse([n for n in needed if n.startswith(("libstdc++", "libgcc_s"))], needed)

    def test_no_locale_or_ostream_symbols_exported(self):
        exported = [line.split()[-1] for line in readelf("--dyn-syms", "-W").splitlines()
                    if " DEFAULT " in line and " UND " not in line]
        self.assertTrue(any(s.startswith("PyInit_") for s in exported), "PyInit_ not among the exported symbols")
        leaked = [s for s in exported if re.match(r"_ZNSt6locale|_ZNSo|_ZNSt8numpunct|_ZNKSt7num_put|_ZNSt7num_put", s)]
        self.assertEqual(leaked, [])

    def test_number_in_an_error_message_after_numpy(self):
        with self.assertRaisesRegex(moesq.Error, r"layer 4 outside \[0, 4\)"):
            moesq.MoeLayer(MODEL, 4)


if __name__ == "__main__":
    unittest.main()
