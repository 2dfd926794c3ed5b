"""What the micro-kernel generators (gen_kernel.py, gen_dot.py, gen_avx2.py) share: the tile
height and the epilogue that adds a tile of accumulators to C or stores it."""
MR = 12


def store(flag, p, rows=MR, reg='Z', width=64):
    """The tile's epilogue: add the accumulators (rows of two registers named
    reg0, reg1, ... of width bytes each) to c (flag set) or store them."""
    print(f'''\tMOVBQZX {flag}, AX
\tTESTQ AX, AX
\tJEQ {p}set''')
    for i in range(rows):
        print(f'\tVADDPS (DX), {reg}{2 * i}, {reg}{2 * i}')
        print(f'\tVMOVUPS {reg}{2 * i}, (DX)')
        print(f'\tVADDPS {width}(DX), {reg}{2 * i + 1}, {reg}{2 * i + 1}')
        print(f'\tVMOVUPS {reg}{2 * i + 1}, {width}(DX)')
        if i < rows - 1:
            print('\tADDQ R8, DX')
    print('\tVZEROUPPER\n\tRET')
    print(f'{p}set:')
    for i in range(rows):
        print(f'\tVMOVUPS {reg}{2 * i}, (DX)')
        print(f'\tVMOVUPS {reg}{2 * i + 1}, {width}(DX)')
        if i < rows - 1:
            print('\tADDQ R8, DX')
    print('\tVZEROUPPER\n\tRET')
