"""How real/*.png were labelled by hand: each text line's box read off a 4x crop by eye, and
inside it every pixel at or above a luma level chosen by eye for that box (the ink is flat and
brighter than the tissue there); each mask was checked on a 3x overlay. Run from the repository
root with the samples beside it to rewrite the masks."""

import cv2
import numpy as np

LAB = {
 "polypgen_EndoCV2021_C6_0100032": [((788, 700, 992, 722), 205)],
 "polypgen_EndoCV2021_001177": [((60, 336, 232, 361), 195), ((60, 366, 136, 392), 190)],
 "hyperkvasir_seg_cju0qkwl35piu0993l0dewei2": [((6, 144, 110, 168), 165), ((6, 168, 100, 192), 165), ((6, 192, 62, 214), 160), ((6, 214, 40, 238), 150)],
 "hyperkvasir_seg_cju0qx73cjw570799j4n5cjze": [((0, 142, 106, 168), 165), ((0, 168, 96, 191), 165), ((0, 190, 62, 214), 160), ((0, 214, 38, 238), 150), ((88, 216, 136, 238), 200)],
}
for n, boxes in LAB.items():
    im = cv2.imread(f'../shared/samples/endoscopy/{n}.jpg')
    luma = cv2.cvtColor(im, cv2.COLOR_BGR2GRAY)
    m = np.zeros(luma.shape, np.uint8)
    for (x0, y0, x1, y1), t in boxes:
        m[y0:y1, x0:x1] = np.where(luma[y0:y1, x0:x1] >= t, 255, 0)
    cv2.imwrite(f'tests/data/scene_labels/real/{n}.png', m, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    print(n, int((m > 0).sum()))
